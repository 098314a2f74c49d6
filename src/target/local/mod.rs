//! The local target: a real stack on this machine (see [`testbed`]), faults done for real
//! (SIGKILL, SIGSTOP, rolling restarts onto another etcd binary, member add/remove), observed
//! through the etcd API.

pub mod backup;
pub mod disk;
pub mod etcd;
pub mod nft;
pub mod reap;
pub mod testbed;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use etcd_client::GetOptions;
use serde_json::json;
use shakedown_faults::{BackupId, MemberId, Model, Op, OutageMode, Profile, SiteId};
use shakedown_invariants::{Durability, InvariantId, ListedMember, Marks, MemberStatus, Observation, Probe, ServingSample};
use tokio::sync::watch;
use tokio::time::Instant;

pub use crate::target::TargetError as LocalError;
use crate::target::Target;
pub use disk::DiskMode;
pub use testbed::{Testbed, TestbedConfig};
use workload::Workload;

/// A documented way to make one of the local target's own operations wrong, to show that the
/// invariants catch a real class of provider bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlantedBug {
    /// The rolling upgrade does not wait for the upgraded member to be healthy before taking the
    /// next one down. Caught by `quorum`.
    UpgradeNoWait,
    /// The rolling replace forgets to remove the old member from the etcd cluster. Caught by
    /// `membership`.
    ReplaceKeepsOldMember,
    /// The endpoint (HAProxy) has no health checks, so it keeps routing to a member that cannot
    /// answer. Caught by `reachability`.
    EndpointNoHealthCheck,
    /// The write path acknowledges a write before etcd does (write-behind: acknowledged when
    /// queued, sent 100 ms later). Caught by `durability` at the first check.
    AckBeforeWrite,
    /// Site recovery removes the inbound partition rule but leaves the outbound one. Caught by
    /// `leaks`.
    RecoverLeavesRule,
    /// Disk reattach restarts the member on the disk that is still shut down (no remount), and
    /// does not replace it when it fails. Caught by `members`.
    ReattachOnShutdownDisk,
    /// Restore brings back only some members: the last keeps its old data and old cluster, so
    /// the new cluster never hears from it. Caught by `membership`.
    RestorePartial,
}

impl PlantedBug {
    pub const ALL: [PlantedBug; 7] = [
        PlantedBug::UpgradeNoWait,
        PlantedBug::ReplaceKeepsOldMember,
        PlantedBug::EndpointNoHealthCheck,
        PlantedBug::AckBeforeWrite,
        PlantedBug::RecoverLeavesRule,
        PlantedBug::ReattachOnShutdownDisk,
        PlantedBug::RestorePartial,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::UpgradeNoWait => "upgrade-no-wait",
            PlantedBug::ReplaceKeepsOldMember => "replace-keeps-old-member",
            PlantedBug::EndpointNoHealthCheck => "endpoint-no-health-check",
            PlantedBug::AckBeforeWrite => "ack-before-write",
            PlantedBug::RecoverLeavesRule => "recover-leaves-rule",
            PlantedBug::ReattachOnShutdownDisk => "reattach-on-shutdown-disk",
            PlantedBug::RestorePartial => "restore-partial",
        }
    }

    /// The invariant meant to catch it.
    pub fn caught_by(self) -> InvariantId {
        match self {
            PlantedBug::UpgradeNoWait => InvariantId::Quorum,
            PlantedBug::ReplaceKeepsOldMember => InvariantId::Membership,
            PlantedBug::EndpointNoHealthCheck => InvariantId::Reachability,
            PlantedBug::AckBeforeWrite => InvariantId::Durability,
            PlantedBug::RecoverLeavesRule => InvariantId::Leaks,
            PlantedBug::ReattachOnShutdownDisk => InvariantId::Members,
            PlantedBug::RestorePartial => InvariantId::Membership,
        }
    }

    /// Whether executing `op` exposes the bug (what a plan must contain to show it).
    pub fn triggered_by(self, op: &Op) -> bool {
        match self {
            PlantedBug::UpgradeNoWait => matches!(op, Op::RollingUpgrade { .. }),
            PlantedBug::ReplaceKeepsOldMember => matches!(op, Op::RollingReplace),
            PlantedBug::EndpointNoHealthCheck => matches!(op, Op::Pause { .. }),
            PlantedBug::AckBeforeWrite => true,
            // Recovery from an isolation (the plan generator only recovers sites that are out).
            PlantedBug::RecoverLeavesRule => matches!(op, Op::SiteOutage { mode: OutageMode::Isolate, .. }),
            PlantedBug::ReattachOnShutdownDisk => matches!(op, Op::DiskReattach { .. }),
            PlantedBug::RestorePartial => matches!(op, Op::Restore { .. }),
        }
    }
}

impl fmt::Display for PlantedBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PlantedBug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        shakedown_faults::parse_name(s, &PlantedBug::ALL, PlantedBug::name, "planted bug")
    }
}

/// Bounds used by the local target's own waits.
#[derive(Debug, Clone)]
pub struct LocalBounds {
    /// One status/hash/member-list request to a member.
    pub request: Duration,
    /// One linearizable read through the endpoint.
    pub probe: Duration,
    /// A whole op, including its waits for health.
    pub op: Duration,
    /// How long a freshly restored cluster may take to be healthy and caught up (the profile's
    /// `converge`: starting members from a snapshot is convergence, not the op's own work).
    pub converge: Duration,
    /// How often members are sampled while an op runs.
    pub sample_every: Duration,
}

impl LocalBounds {
    pub fn from_profile(p: &Profile) -> LocalBounds {
        LocalBounds { request: Duration::from_millis(500), probe: p.timeouts.probe, op: p.timeouts.op, converge: p.timeouts.converge, sample_every: Duration::from_millis(10) }
    }
}

pub struct LocalTarget {
    pub testbed: Testbed,
    workload: Workload,
    bounds: LocalBounds,
    sampler: Option<Sampler>,
    /// Where backups and restores fall in the workload's acknowledged writes.
    marks: Marks,
    /// How many restores this run did (each new cluster gets its own token).
    restores: u32,
}

impl LocalTarget {
    /// Brings the stack up and starts the workload.
    pub async fn start(cfg: TestbedConfig, profile: &Profile, model: &Model, bring_up_limit: Duration) -> Result<LocalTarget, LocalError> {
        let bug = cfg.bug;
        let prefix = format!("/shakedown/{}/w/", cfg.run_id);
        let samples = cfg.run_dir.join("workload.csv");
        let testbed = Testbed::up(cfg, model, bring_up_limit).await?;
        let workload = Workload::start(
            testbed.endpoint_url(),
            prefix,
            profile.workload.interval,
            profile.workload.timeout,
            bug == Some(PlantedBug::AckBeforeWrite),
            Some(&samples),
        );
        Ok(LocalTarget { testbed, workload, bounds: LocalBounds::from_profile(profile), sampler: None, marks: Marks::default(), restores: 0 })
    }

    fn url_of(&self, id: MemberId) -> Result<String, LocalError> {
        self.testbed.members.get(&id).map(|m| m.client_url()).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))
    }

    fn urls(&self) -> Vec<String> {
        self.testbed.members.values().map(|m| m.client_url()).collect()
    }

    fn confirm_serving(&self, url: &str) {
        if let Some(s) = &self.sampler {
            s.confirm(url);
        }
    }

    /// A client to the leader, or to any member that answers when none leads. Members are asked
    /// at once, so a member that does not answer costs one request bound, not one per member.
    async fn cluster_client(&self) -> Result<etcd_client::Client, LocalError> {
        let request = self.bounds.request;
        let answers = futures_join_all(self.urls().into_iter().map(|url| async move {
            let s = etcd::status(&url, request).await.ok();
            (url, s)
        }))
        .await;
        let leads = |s: &etcd_client::StatusResponse| s.leader() != 0 && s.header().is_some_and(|h| h.member_id() == s.leader());
        let pick = answers
            .iter()
            .find(|(_, s)| s.as_ref().is_some_and(leads))
            .or_else(|| answers.iter().find(|(_, s)| s.is_some()))
            .map(|(u, _)| u.clone())
            .ok_or_else(|| LocalError::Stack("no member answers".into()))?;
        etcd::connect(&pick, request).await.map_err(LocalError::Stack)
    }

    /// A membership change, retried within the op bound: etcd refuses reconfiguration while a
    /// member (re)connected less than 5 s ago ("unhealthy cluster"); operators such as KCP retry.
    async fn reconfigure<T, F, Fut>(&self, what: &str, call: F) -> Result<T, String>
    where
        F: Fn(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.bounds.op;
        loop {
            let res = match self.cluster_client().await {
                Ok(c) => etcd::bounded(what, self.bounds.request * 4, call(c)).await,
                Err(e) => Err(e.to_string()),
            };
            match res {
                Ok(v) => return Ok(v),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("{what} refused, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Announces member `id` (which the testbed has, not started) to etcd — as a learner when
    /// asked — then starts it with the cluster as etcd reports it. Returns its etcd member id.
    async fn announce_and_start(&mut self, id: MemberId, learner: bool) -> Result<u64, LocalError> {
        let name = id.to_string();
        let peer = self.testbed.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?.peer_url();
        let options = learner.then(|| etcd_client::MemberAddOptions::new().with_is_learner());
        let added = self
            .reconfigure("member add", |mut c| {
                let (peer, options) = (peer.clone(), options.clone());
                async move { c.member_add([peer.as_str()], options).await }
            })
            .await
            .map_err(|e| LocalError::Stack(format!("adding {id}: {e}")))?;
        let etcd_id = added.member().map(|m| m.id()).unwrap_or(0);
        // The new member has no name in etcd's list until it starts: it is `name`.
        let cluster: Vec<String> = added
            .member_list()
            .iter()
            .map(|m| {
                let n = if m.id() == etcd_id { name.as_str() } else { m.name() };
                format!("{n}={}", m.peer_urls().first().cloned().unwrap_or_default())
            })
            .collect();
        self.testbed.spawn_member(id, &cluster.join(","), "existing")?;
        Ok(etcd_id)
    }

    /// Waits until member `id` sees a leader and caught up with the others (bounded by the op
    /// bound), and tells the sampler it serves.
    async fn wait_caught_up(&self, id: MemberId, what: &str) -> Result<(), LocalError> {
        let url = self.url_of(id)?;
        let others: Vec<String> = self.urls().into_iter().filter(|u| *u != url).collect();
        etcd::wait_caught_up(&url, &others, self.bounds.op).await.map_err(|e| LocalError::Stack(format!("{what} {id}: {e}")))?;
        self.confirm_serving(&url);
        Ok(())
    }

    /// etcd's member id of the member named `name`.
    async fn etcd_id(&self, name: &str) -> Result<Option<u64>, LocalError> {
        let mut c = self.cluster_client().await?;
        let list = etcd::bounded("member list", self.bounds.request, c.member_list()).await.map_err(LocalError::Stack)?;
        Ok(list.members().iter().find(|m| m.name() == name).map(|m| m.id()))
    }

    /// Moves leadership off `id` if it leads (best effort: etcd also does it on SIGTERM).
    async fn move_leader_off(&self, id: MemberId) {
        let Ok(url) = self.url_of(id) else { return };
        let Ok(s) = etcd::status(&url, self.bounds.request).await else { return };
        let me = s.header().map(|h| h.member_id()).unwrap_or(0);
        if s.leader() != me || me == 0 {
            return;
        }
        let Ok(mut c) = etcd::connect(&url, self.bounds.request).await else { return };
        let Ok(list) = etcd::bounded("member list", self.bounds.request, c.member_list()).await else { return };
        if let Some(to) = list.members().iter().find(|m| m.id() != me && !m.name().is_empty()) {
            let res = etcd::bounded("move leader", Duration::from_secs(3), c.move_leader(to.id())).await;
            tracing::debug!(from = %id, to = to.name(), ?res, "moved leadership");
        }
    }

    async fn rolling_upgrade(&mut self, after: &Model) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.testbed.members.keys().copied().collect();
        for id in ids {
            let to = after.member(id).map_err(|e| LocalError::Stack(e.to_string()))?.version;
            if self.testbed.members[&id].version == to {
                continue;
            }
            self.move_leader_off(id).await;
            self.testbed.stop(id, Duration::from_secs(10)).await?;
            self.testbed.members.get_mut(&id).expect("listed above").version = to;
            let cluster = self.testbed.initial_cluster();
            self.testbed.spawn_member(id, &cluster, "existing")?;
            if !self.bug(PlantedBug::UpgradeNoWait) {
                self.wait_caught_up(id, "upgraded").await?;
            }
        }
        Ok(())
    }

    async fn rolling_replace(&mut self, before: &Model, after: &Model) -> Result<(), LocalError> {
        for (old, new) in before.replacements() {
            let spec = after.member(new).map_err(|e| LocalError::Stack(e.to_string()))?.clone();
            let url = self.testbed.add_member(new, spec.site, spec.version)?.client_url();
            if let Some(s) = &self.sampler {
                s.watch(&url);
            }
            if let Err(e) = self.announce_and_start(new, false).await {
                self.testbed.remove_member(new).ok();
                return Err(e);
            }
            self.wait_caught_up(new, "new member").await?;
            self.move_leader_off(old).await;
            if !self.bug(PlantedBug::ReplaceKeepsOldMember) {
                let old_id = self.etcd_id(&old.to_string()).await?.ok_or_else(|| LocalError::Stack(format!("{old} is not in the member list")))?;
                self.reconfigure("member remove", |mut c| async move { c.member_remove(old_id).await })
                    .await
                    .map_err(|e| LocalError::Stack(format!("removing {old}: {e}")))?;
            }
            self.testbed.stop(old, Duration::from_secs(5)).await?;
            self.testbed.remove_member(old)?;
            self.testbed.start_haproxy()?;
        }
        Ok(())
    }

    fn bug(&self, bug: PlantedBug) -> bool {
        self.testbed.cfg.bug == Some(bug)
    }

    async fn site_outage(&mut self, site: SiteId, mode: OutageMode) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.testbed.members.values().filter(|m| m.site == site).map(|m| m.id).collect();
        match mode {
            OutageMode::PowerLoss => ids.into_iter().try_for_each(|id| self.testbed.kill(id)),
            OutageMode::Isolate => {
                let (table, subnet, gid) = (self.testbed.nft_table(), self.testbed.site_subnet(site), self.testbed.site_gid(site));
                nft::isolate(&table, &site.to_string(), subnet, gid)
            }
        }
    }

    async fn site_recover(&mut self, site: SiteId, before: &Model) -> Result<(), LocalError> {
        match before.outages.get(&site) {
            Some(OutageMode::Isolate) => nft::recover(&self.testbed.nft_table(), &site.to_string(), self.bug(PlantedBug::RecoverLeavesRule)),
            Some(OutageMode::PowerLoss) => {
                let ids: Vec<MemberId> = self.testbed.members.values().filter(|m| m.site == site).map(|m| m.id).collect();
                let cluster = self.testbed.initial_cluster();
                ids.into_iter().try_for_each(|id| self.testbed.spawn_member(id, &cluster, "existing"))
            }
            None => Err(LocalError::Stack(format!("{site} is not out"))),
        }
    }

    /// Unmount, check, remount; then the member's etcd data is discarded and the member re-added
    /// empty (remove, add as a learner, start, promote once in sync). etcd cannot prove its data complete
    /// after an abrupt detach, and a member restarted on it was seen to win an election and serve
    /// a stale store (see ARCHITECTURE.md); an operator re-adds it instead.
    async fn disk_reattach(&mut self, id: MemberId) -> Result<(), LocalError> {
        // The member usually died on EIO; if it did not, it is stopped now.
        self.testbed.kill(id)?;
        let cluster = self.testbed.initial_cluster();
        if self.bug(PlantedBug::ReattachOnShutdownDisk) {
            return self.testbed.spawn_member(id, &cluster, "existing");
        }
        if let Err(e) = self.testbed.remount_disk(id) {
            tracing::info!(member = %id, "disk unusable after reattach ({e}); giving the member a fresh disk");
            self.testbed.replace_disk(id)?;
        }
        let data = self.testbed.members[&id].disk.data_dir();
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).map_err(|e| LocalError::Environment(format!("cannot create {}: {e}", data.display())))?;
        let name = id.to_string();
        if let Some(etcd_id) = self.etcd_id(&name).await? {
            self.reconfigure("member remove", |mut c| async move { c.member_remove(etcd_id).await }).await.map_err(|e| LocalError::Stack(format!("removing {id}: {e}")))?;
        }
        // Re-added as a learner, promoted once it has caught up: a learner does not count
        // towards quorum while it syncs.
        let etcd_id = self.announce_and_start(id, true).await?;
        // etcd refuses the promotion until the learner is in sync: retried within the op bound.
        self.reconfigure("member promote", |mut c| async move { c.member_promote(etcd_id).await })
            .await
            .map_err(|e| LocalError::Stack(format!("promoting {id}: {e}")))?;
        self.wait_caught_up(id, "re-added").await
    }

    fn backup_path(&self, b: BackupId) -> std::path::PathBuf {
        self.testbed.cfg.run_dir.join("backups").join(format!("{b}.db"))
    }

    async fn backup(&mut self, after: &Model) -> Result<(), LocalError> {
        let b = *after.backups.last().ok_or_else(|| LocalError::Stack("the model has no backup to take".into()))?;
        let path = self.backup_path(b);
        std::fs::create_dir_all(path.parent().expect("has a parent")).map_err(|e| LocalError::Environment(format!("cannot create the backup store: {e}")))?;
        // From the leader: it has applied every acknowledged write; a follower may lag.
        let mut c = self.cluster_client().await?;
        let start = self.workload.acked_len();
        let size = backup::take(&mut c, &path, self.bounds.op).await.map_err(LocalError::Stack)?;
        // The workload's one write in flight when the snapshot ended may be in it and be
        // acknowledged just after: it is the next position, so the snapshot's window ends
        // after it (seen as a false "restore did not restore" with a 2 ms workload interval).
        self.marks.backups.insert(b, (start, self.workload.acked_len() + 1));
        tracing::debug!(backup = %b, bytes = size, "backup taken");
        Ok(())
    }

    async fn restore(&mut self, b: BackupId) -> Result<(), LocalError> {
        let path = self.backup_path(b);
        // Refuse a damaged backup before touching the running cluster.
        backup::verify(&path).map_err(|e| LocalError::Stack(format!("restore refused, the cluster was left untouched: {e}")))?;
        let version = self.testbed.members.values().map(|m| m.version).max().ok_or_else(|| LocalError::Stack("no members".into()))?;
        let tool = self.testbed.cfg.binaries.etcd.get(&version).and_then(|e| e.restore_tool.clone()).ok_or_else(|| {
            LocalError::Environment(format!("no snapshot restore tool (etcdutl or etcdctl) beside the etcd {version} binary"))
        })?;
        // Recorded before anything stops, open-ended until the stack is back: if the restore
        // fails or is cut short, every write from its start on is uncertain.
        self.marks.restores.push((b, self.workload.acked_len(), usize::MAX));
        let res = self.restore_cluster(&tool, &path, b).await;
        if let Some(last) = self.marks.restores.last_mut() {
            last.2 = self.workload.acked_len();
        }
        res
    }

    async fn restore_cluster(&mut self, tool: &std::path::Path, path: &std::path::Path, b: BackupId) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.testbed.members.keys().copied().collect();
        // The data is about to be replaced: a hard stop (a graceful one hangs on the last member,
        // which has no quorum left to hand leadership over).
        ids.iter().try_for_each(|&id| self.testbed.kill(id))?;
        self.restores += 1;
        let token = format!("{}-r{}", self.testbed.cfg.run_id, self.restores);
        let cluster = self.testbed.initial_cluster();
        let restored: Vec<MemberId> = if self.bug(PlantedBug::RestorePartial) { ids[..ids.len() - 1].to_vec() } else { ids.clone() };
        for &id in &restored {
            self.testbed.replace_disk(id)?;
            let m = &self.testbed.members[&id];
            let data = m.disk.data_dir();
            let _ = std::fs::remove_dir_all(&data);
            backup::restore_into(tool, path, &m.name(), &cluster, &token, &m.peer_url(), &data)?;
        }
        for &id in &ids {
            self.testbed.spawn_member(id, &cluster, "new")?;
        }
        let urls = self.urls();
        for url in &urls {
            etcd::wait_caught_up(url, &urls, self.bounds.converge).await.map_err(|e| LocalError::Stack(format!("after restoring {b}: {e}")))?;
            self.confirm_serving(url);
        }
        Ok(())
    }

    async fn probes(&mut self) -> Vec<Probe> {
        // One fresh connection per endpoint server: HAProxy's round robin sends each to a
        // different member, so a member the endpoint should have routed around is hit.
        let n = self.testbed.members.len().max(1);
        let endpoint = self.testbed.endpoint_url();
        let limit = self.bounds.probe;
        let key = format!("/shakedown/{}/probe", self.testbed.cfg.run_id);
        let futs = (0..n).map(|_| {
            let (endpoint, key) = (endpoint.clone(), key.clone());
            async move {
                let t0 = Instant::now();
                let res = async {
                    let mut c = etcd::connect(&endpoint, limit).await?;
                    etcd::bounded("linearizable read", limit, c.get(key.as_str(), None)).await
                }
                .await;
                Probe { latency_ms: t0.elapsed().as_millis() as u64, error: res.err() }
            }
        });
        futures_join_all(futs).await
    }

    async fn durability(&self) -> Durability {
        let acked = self.workload.acked();
        let limit = self.bounds.probe;
        let res = async {
            let mut c = etcd::connect(&self.testbed.endpoint_url(), limit).await?;
            etcd::bounded("read back", limit.max(Duration::from_secs(2)), c.get(self.workload.prefix.as_str(), Some(GetOptions::new().with_prefix()))).await
        }
        .await;
        match res {
            Ok(resp) => Durability {
                read: resp
                    .kvs()
                    .iter()
                    .map(|kv| (String::from_utf8_lossy(kv.key()).to_string(), String::from_utf8_lossy(kv.value()).to_string()))
                    .collect(),
                acked,
                marks: self.marks.clone(),
                read_error: None,
            },
            Err(e) => Durability { acked, marks: self.marks.clone(), read: HashMap::new(), read_error: Some(e) },
        }
    }
}

/// Joins futures concurrently, in order (a tiny join_all, to avoid a dependency for one call).
async fn futures_join_all<F: std::future::Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("observation task does not panic"));
    }
    out
}

/// One member's serving state changes, as (ms since the step began, serving).
type Flips = Arc<Mutex<Vec<(u64, bool)>>>;

/// Watches one member every `every`. A refused connection marks it not serving (at the time of
/// the attempt); an answer marks it serving (at the time of the answer); a request that times
/// out or fails changes nothing, so a slow machine cannot fake an outage. A member that never
/// answers (paused) counts as not serving once the first 300 ms of the step have passed.
async fn watch_member(url: String, t0: Instant, every: Duration, flips: Flips, mut stop: watch::Receiver<bool>) {
    let addr = url.trim_start_matches("http://").to_string();
    let mut client: Option<etcd_client::Client> = None;
    let mut last: Option<bool> = None;
    let push = |at: Instant, serving: bool, last: &mut Option<bool>| {
        if *last != Some(serving) {
            *last = Some(serving);
            flips.lock().expect("flips lock").push((at.duration_since(t0).as_millis() as u64, serving));
        }
    };
    while !*stop.borrow() {
        let tick = Instant::now();
        let connect = tokio::time::timeout(Duration::from_millis(100), tokio::net::TcpStream::connect(&addr)).await;
        match connect {
            Ok(Err(_)) => push(tick, false, &mut last),
            Err(_) => {}
            Ok(Ok(_)) => {
                if client.is_none() {
                    client = etcd::connect(&url, Duration::from_millis(250)).await.ok();
                }
                if let Some(c) = client.as_mut() {
                    match tokio::time::timeout(Duration::from_millis(250), c.status()).await {
                        Ok(Ok(_)) => push(Instant::now(), true, &mut last),
                        // An error answer from a listening member is no evidence either way
                        // (a fresh channel may not be ready yet): try again on a new client.
                        Ok(Err(_)) => client = None,
                        Err(_) => {}
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(tick + every) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Watches every member and the membership until `stop` fires; new members (a rolling replace
/// adds them) are watched as the member list shows them.
fn spawn_watcher(url: &str, t0: Instant, every: Duration, watched: &Arc<Mutex<BTreeMap<String, Flips>>>, stop: watch::Receiver<bool>) {
    let mut w = watched.lock().expect("watched lock");
    if !w.contains_key(url) {
        let flips: Flips = Arc::new(Mutex::new(Vec::new()));
        w.insert(url.to_string(), flips.clone());
        // Watchers end when `stop` fires; they are bounded by the step.
        tokio::spawn(watch_member(url.to_string(), t0, every, flips, stop));
    }
}

async fn sample_serving(initial: Vec<(String, String)>, t0: Instant, every: Duration, stop: watch::Receiver<bool>, membership: Arc<Mutex<Vec<(u64, BTreeMap<String, String>)>>>, watched: Arc<Mutex<BTreeMap<String, Flips>>>) {
    let mut names: BTreeMap<String, String> = initial.iter().map(|(n, u)| (u.clone(), n.clone())).collect();
    let mut stop_rx = stop.clone();
    loop {
        for url in names.keys() {
            spawn_watcher(url, t0, every, &watched, stop.clone());
        }
        // The membership, from any member that answers.
        for url in names.keys().cloned().collect::<Vec<_>>() {
            let Ok(mut c) = etcd::connect(&url, Duration::from_millis(250)).await else { continue };
            if let Ok(list) = etcd::bounded("member list", Duration::from_millis(250), c.member_list()).await {
                // A member added but not started yet has no client URL: on this testbed it is its
                // peer URL with the client port.
                let members: BTreeMap<String, String> = list
                    .members()
                    .iter()
                    .filter_map(|m| {
                        let client = m.client_urls().first().cloned().or_else(|| m.peer_urls().first().map(|p| p.replace(&format!(":{}", testbed::PEER_PORT), &format!(":{}", testbed::CLIENT_PORT))))?;
                        let name = if m.name().is_empty() { format!("unstarted {client}") } else { m.name().to_string() };
                        Some((client, name))
                    })
                    .collect();
                let view = members.clone();
                names.extend(members);
                membership.lock().expect("membership lock").push((t0.elapsed().as_millis() as u64, view));
                break;
            }
        }
        if *stop_rx.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop_rx.changed() => {}
        }
    }
}

/// Merges per-member flips and membership snapshots into samples: one per change, each listing
/// the members serving at that instant among the members of the cluster at that instant.
fn merge_samples(membership: &[(u64, BTreeMap<String, String>)], watched: &BTreeMap<String, Flips>) -> Vec<ServingSample> {
    let mut times: BTreeSet<u64> = membership.iter().map(|(t, _)| *t).collect();
    let flips: BTreeMap<&String, Vec<(u64, bool)>> = watched
        .iter()
        .map(|(u, f)| {
            let mut v = f.lock().expect("flips lock").clone();
            v.sort_by_key(|(t, _)| *t);
            (u, v)
        })
        .collect();
    times.extend(flips.values().flat_map(|v| v.iter().map(|(t, _)| *t)));
    let mut out = Vec::new();
    for t in times {
        // The membership as last seen at or before t.
        let Some((_, members)) = membership.iter().rev().find(|(mt, _)| *mt <= t) else { continue };
        // Until every member has answered or refused once (or 300 ms passed), the picture is incomplete.
        let all_known = members.keys().all(|u| flips.get(u).is_some_and(|f| f.first().is_some_and(|(ft, _)| *ft <= t)));
        if !all_known && t < 300 {
            continue;
        }
        let serving: Vec<String> = members
            .iter()
            .filter(|(u, _)| flips.get(u).and_then(|f| f.iter().rev().find(|(ft, _)| *ft <= t)).is_some_and(|(_, s)| *s))
            .map(|(_, n)| n.clone())
            .collect();
        out.push(ServingSample { at_ms: t, serving, cluster_size: members.len() });
    }
    out
}

/// The serving sampler of the current step: runs from the start of an op until the engine ends
/// the step (after its checks), so a quorum loss that outlives the op is seen too.
struct Sampler {
    t0: Instant,
    stop: watch::Sender<bool>,
    every: Duration,
    membership: Arc<Mutex<Vec<(u64, BTreeMap<String, String>)>>>,
    watched: Arc<Mutex<BTreeMap<String, Flips>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(members: Vec<(String, String)>, every: Duration) -> Sampler {
        let (stop, rx) = watch::channel(false);
        let membership = Arc::new(Mutex::new(Vec::new()));
        let watched = Arc::new(Mutex::new(BTreeMap::new()));
        let t0 = Instant::now();
        let task = tokio::spawn(sample_serving(members, t0, every, rx, membership.clone(), watched.clone()));
        Sampler { t0, stop, every, membership, watched, task }
    }

    /// Starts watching a member right away (a member the target is about to add).
    fn watch(&self, url: &str) {
        spawn_watcher(url, self.t0, self.every, &self.watched, self.stop.subscribe());
    }

    /// The target itself just saw the member at `url` answer (its own wait for health): that is
    /// evidence too, and earlier than the watcher's next poll.
    fn confirm(&self, url: &str) {
        if let Some(f) = self.watched.lock().expect("watched lock").get(url) {
            f.lock().expect("flips lock").push((self.t0.elapsed().as_millis() as u64, true));
        }
    }

    fn samples(&self) -> Vec<ServingSample> {
        let membership = self.membership.lock().expect("membership lock").clone();
        let watched = self.watched.lock().expect("watched lock").clone();
        if tracing::enabled!(tracing::Level::TRACE) {
            for (u, f) in &watched {
                tracing::trace!(url = u.as_str(), flips = ?f.lock().expect("flips lock"), "serving flips");
            }
            tracing::trace!(?membership, "membership snapshots");
        }
        merge_samples(&membership, &watched)
    }

    async fn finish(self) {
        let _ = self.stop.send(true);
        let abort = self.task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), self.task).await.is_err() {
            abort.abort();
        }
    }
}

impl Target for LocalTarget {
    fn name(&self) -> &'static str {
        "local"
    }

    fn component_versions(&self) -> BTreeMap<String, String> {
        let b = &self.testbed.cfg.binaries;
        let mut v: BTreeMap<String, String> = b.etcd.iter().map(|(k, e)| (format!("etcd-{k}"), e.full_version.clone())).collect();
        v.insert("haproxy".into(), b.haproxy_version.clone());
        v.insert("disks".into(), format!("{:?}", self.testbed.cfg.disks).to_lowercase());
        v
    }

    fn supports(&self, op: &Op) -> Result<(), String> {
        match op {
            Op::SiteOutage { mode: OutageMode::Isolate, .. } if self.testbed.cfg.disks != DiskMode::Loop => {
                Err("site isolation needs root (nftables and per-site group ids)".into())
            }
            Op::SiteOutage { mode: OutageMode::Isolate, .. } => nft::available(),
            Op::DiskDetach { .. } | Op::DiskReattach { .. } if self.testbed.cfg.disks != DiskMode::Loop => {
                Err("disk faults need loop-mounted disks (root)".into())
            }
            _ => Ok(()),
        }
    }

    async fn execute(&mut self, op: &Op, before: &Model, after: &Model) -> Result<(), LocalError> {
        if self.sampler.is_none() {
            let members = self.testbed.members.values().map(|m| (m.name(), m.client_url())).collect();
            self.sampler = Some(Sampler::start(members, self.bounds.sample_every));
        }
        let limit = self.bounds.op;
        let res = tokio::time::timeout(limit, async {
            match *op {
                Op::Crash { member } => self.testbed.kill(member),
                Op::Restart { member } => {
                    let cluster = self.testbed.initial_cluster();
                    self.testbed.spawn_member(member, &cluster, "existing")
                }
                Op::Pause { member } => self.testbed.signal(member, libc::SIGSTOP),
                Op::Resume { member } => self.testbed.signal(member, libc::SIGCONT),
                Op::RollingUpgrade { .. } => self.rolling_upgrade(after).await,
                Op::RollingReplace => self.rolling_replace(before, after).await,
                Op::SiteOutage { site, mode } => self.site_outage(site, mode).await,
                Op::SiteRecover { site } => self.site_recover(site, before).await,
                Op::DiskDetach { member } => self.testbed.shutdown_disk(member),
                Op::DiskReattach { member } => self.disk_reattach(member).await,
                Op::Backup => self.backup(after).await,
                Op::Restore { backup } => self.restore(backup).await,
            }
        })
        .await
        .unwrap_or_else(|_| Err(LocalError::Stack(format!("{op} did not finish within {}s", limit.as_secs()))));
        res
    }

    async fn end_step(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.finish().await;
        }
    }

    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        let wants = |i: InvariantId| invariants.contains(&i);
        let request = self.bounds.request;
        let members: Vec<(String, String)> = self.testbed.members.values().map(|m| (m.name(), m.client_url())).collect();
        let status_futs = members.iter().cloned().map(|(name, url)| async move {
            let r = etcd::status(&url, request).await;
            (name, url, r)
        });
        let statuses = futures_join_all(status_futs).await;
        let mut obs = Observation::default();
        if let Some(s) = &self.sampler {
            obs.serving_samples = s.samples();
            obs.samples_until_ms = s.t0.elapsed().as_millis() as u64;
        }
        let mut leader_url = None;
        for (name, url, r) in &statuses {
            let member = name.parse::<MemberId>().ok();
            obs.members.push(match r {
                Ok(s) => {
                    let me = s.header().map(|h| h.member_id());
                    if s.leader() != 0 && me == Some(s.leader()) {
                        leader_url = Some(url.clone());
                    }
                    MemberStatus {
                        name: name.clone(),
                        member,
                        reachable: true,
                        leader: (s.leader() != 0).then_some(s.leader()),
                        etcd_id: me,
                        revision: s.header().map(|h| h.revision()).unwrap_or(0),
                        raft_index: s.raft_index(),
                        version: Some(s.version().to_string()),
                        hash: None,
                        error: None,
                    }
                }
                Err(e) => MemberStatus { name: name.clone(), member, reachable: false, leader: None, etcd_id: None, revision: 0, raft_index: 0, version: None, hash: None, error: Some(e.clone()) },
            });
        }
        let any_url = leader_url.or_else(|| statuses.iter().find(|(_, _, r)| r.is_ok()).map(|(_, u, _)| u.clone()));
        if wants(InvariantId::Membership) || wants(InvariantId::Quorum) {
            if let Some(url) = &any_url {
                if let Ok(mut c) = etcd::connect(url, request).await {
                    if let Ok(list) = etcd::bounded("member list", request, c.member_list()).await {
                        obs.member_list = Some(
                            list.members().iter().map(|m| ListedMember { id: m.id(), name: m.name().to_string(), peer_urls: m.peer_urls().to_vec() }).collect(),
                        );
                    }
                }
            }
        }
        if wants(InvariantId::Consistency) {
            let rev = obs.members.iter().filter(|m| m.reachable && m.revision > 0).map(|m| m.revision).min();
            if let Some(rev) = rev {
                let futs = statuses.iter().filter(|(_, _, r)| r.is_ok()).map(|(name, url, _)| {
                    let (name, url) = (name.clone(), url.clone());
                    async move {
                        let r = async {
                            let mut c = etcd::connect(&url, request).await?;
                            etcd::bounded("hash kv", request, c.hash_kv(rev)).await
                        }
                        .await;
                        (name, r.map(|h| h.hash()))
                    }
                });
                for (name, r) in futures_join_all(futs).await {
                    if let (Ok(h), Some(m)) = (r, obs.members.iter_mut().find(|m| m.name == name)) {
                        m.hash = Some((rev, h));
                    }
                }
            }
        }
        if wants(InvariantId::Reachability) && model.service_expected_up() {
            obs.probes = self.probes().await;
        }
        if wants(InvariantId::Durability) && model.service_expected_up() {
            obs.durability = Some(self.durability().await);
        }
        if wants(InvariantId::Leaks) {
            obs.inventory = Some(reap::inventory(&self.testbed.cfg.run_dir, &self.testbed.nft_table(), self.testbed.cfg.disks == DiskMode::Loop));
        }
        obs
    }

    fn log_files(&self) -> Vec<(String, std::path::PathBuf)> {
        let Ok(rd) = std::fs::read_dir(self.testbed.cfg.run_dir.join("logs")) else { return vec![] };
        let mut logs: Vec<(String, std::path::PathBuf)> =
            rd.flatten().filter_map(|e| e.file_name().to_str().and_then(|f| f.strip_suffix(".log")).map(|n| (n.to_string(), e.path()))).collect();
        logs.sort();
        logs
    }

    fn workload_stats(&self) -> serde_json::Value {
        json!(self.workload.stats())
    }

    async fn teardown(&mut self) {
        self.end_step().await;
        self.workload.stop().await;
        self.testbed.teardown();
    }
}
