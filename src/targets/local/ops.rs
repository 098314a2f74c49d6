//! The local target's ops: membership changes, rolling upgrade and replace, site outages, disk
//! reattach and replace, backup and restore. Each is bounded by the op bound (the caller's
//! timeout) and by its own waits.

use std::time::Duration;

use serde_json::json;
use shakedown_faults::{BackupId, MemberId, Model, Op, OutageMode, SiteId};
use tokio::time::Instant;

use super::bugs::PlantedBug;
use super::{
    backup, etcd, futures_join_all, nft, observe, testbed::PEER_PORT, DiskMode, LocalError, LocalTarget, EXIT_POLL, MOVE_LEADER_BOUND,
    PEERS_KNOW_POLL, RECONFIGURE_RETRY, REPLACE_STOP_GRACE, UPGRADE_STOP_GRACE,
};

/// Why a membership change (see [`LocalTarget::reconfigure`]) did not happen within the op bound.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReconfigureError {
    /// No member answered to take the change.
    #[error("{0}")]
    NoClient(LocalError),
    /// etcd refused the change (or did not answer) until the bound.
    #[error(transparent)]
    Etcd(etcd::EtcdError),
    /// etcd refused the change in a way waiting cannot help (`why`).
    #[error("{error}: {why}")]
    Hopeless { error: Box<ReconfigureError>, why: String },
}

impl LocalTarget {
    pub(super) fn url_of(&self, id: MemberId) -> Result<String, LocalError> {
        self.testbed.members.get(&id).map(|m| m.client_url()).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))
    }

    pub(super) fn urls(&self) -> Vec<String> {
        self.testbed.members.values().map(|m| m.client_url()).collect()
    }

    pub(super) fn confirm_serving(&self, url: &str) {
        if let Some(s) = &self.sampler {
            s.confirm(url);
        }
    }

    /// Of `urls`, those whose member answers a status request, the leader first (the others in
    /// the given order). Members are asked at once, so a member that does not answer costs one
    /// request bound, not one per member.
    async fn answering(&self, urls: Vec<String>) -> Vec<String> {
        let request = self.bounds.request;
        let answers = futures_join_all(urls.into_iter().map(|url| async move {
            let s = etcd::status(&url, request).await.ok();
            (url, s)
        }))
        .await;
        let leads = |s: &etcd_client::StatusResponse| s.leader() != 0 && s.header().is_some_and(|h| h.member_id() == s.leader());
        let mut answering: Vec<(bool, String)> = answers.into_iter().filter_map(|(u, s)| s.map(|s| (!leads(&s), u))).collect();
        answering.sort_by_key(|(follower, _)| *follower);
        answering.into_iter().map(|(_, u)| u).collect()
    }

    /// A client to the leader, or to any member that answers when none leads.
    pub(super) async fn cluster_client(&self) -> Result<etcd_client::Client, LocalError> {
        let pick = self.answering(self.urls()).await.into_iter().next().ok_or_else(|| LocalError::Stack("no member answers".into()))?;
        etcd::connect(&pick, self.bounds.request).await.map_err(|e| LocalError::Stack(e.to_string()))
    }

    /// A membership change, retried within the op bound: etcd refuses reconfiguration while a
    /// member (re)connected less than 5 s ago ("unhealthy cluster"); operators such as KCP retry.
    /// A change is not idempotent, and its answer can be lost after etcd applied it (the member
    /// asked was the one being removed, and it exits as the removal applies): before each retry
    /// the member list is read, and `done` says whether the change is already in it (its result
    /// then comes from the list). Without that check a lost answer turned into retries refused
    /// until the op bound ("member not found", "peer URL exists"; seen under load as a rolling
    /// replace that "did not finish within 120s").
    ///
    /// `hopeless` reads the refusal and the member list: `Some(why)` when waiting cannot help,
    /// and the change fails at once, saying why.
    pub(super) async fn reconfigure<T, F, Fut>(
        &self,
        what: &str,
        call: F,
        done: impl Fn(&[etcd_client::Member]) -> Option<T>,
        hopeless: impl Fn(&str, &[etcd_client::Member]) -> Option<String>,
    ) -> Result<T, ReconfigureError>
    where
        F: Fn(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.bounds.op;
        loop {
            let res = match self.cluster_client().await {
                Ok(c) => etcd::bounded(what, self.bounds.request * 4, call(c)).await.map_err(ReconfigureError::Etcd),
                Err(e) => Err(ReconfigureError::NoClient(e)),
            };
            match res {
                Ok(v) => return Ok(v),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("{what} refused, retrying: {e}");
                    tokio::time::sleep(RECONFIGURE_RETRY).await;
                    if let Ok(mut c) = self.cluster_client().await {
                        if let Ok(list) = etcd::bounded("member list", self.bounds.request, c.member_list()).await {
                            if let Some(v) = done(list.members()) {
                                tracing::info!("{what}: the answer was lost ({e}), but the member list shows it applied");
                                return Ok(v);
                            }
                            if let Some(why) = hopeless(&e.to_string(), list.members()) {
                                return Err(ReconfigureError::Hopeless { error: Box::new(e), why });
                            }
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `member remove` of etcd member `etcd_id`, retried (see [`Self::reconfigure`]).
    pub(super) async fn remove_etcd_member(&self, etcd_id: u64) -> Result<(), ReconfigureError> {
        self.reconfigure(
            "member remove",
            |mut c| async move { c.member_remove(etcd_id).await.map(|_| ()) },
            |list| (!list.iter().any(|m| m.id() == etcd_id)).then_some(()),
            |_, _| None,
        )
        .await
    }

    /// Announces member `id` (which the testbed has, not started) to etcd — as a learner when
    /// asked — then starts it with the cluster as etcd reports it. Returns its etcd member id.
    pub(super) async fn announce_and_start(&mut self, id: MemberId, learner: bool) -> Result<u64, LocalError> {
        let name = id.to_string();
        let peer = self.testbed.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?.peer_url();
        let options = learner.then(|| etcd_client::MemberAddOptions::new().with_is_learner());
        // The new member has no name in etcd's list until it starts: it is `name`.
        let cluster_of = |etcd_id: u64, list: &[etcd_client::Member]| -> Vec<String> {
            list.iter()
                .map(|m| {
                    let n = if m.id() == etcd_id { name.as_str() } else { m.name() };
                    format!("{n}={}", m.peer_urls().first().cloned().unwrap_or_default())
                })
                .collect()
        };
        let (etcd_id, cluster) = self
            .reconfigure(
                "member add",
                |mut c| {
                    let (peer, options) = (peer.clone(), options.clone());
                    async move {
                        let added = c.member_add([peer.as_str()], options).await?;
                        let etcd_id = added.member().map(|m| m.id()).unwrap_or(0);
                        Ok((etcd_id, added.member_list().to_vec()))
                    }
                },
                |list| list.iter().find(|m| m.peer_urls().contains(&peer)).map(|m| (m.id(), list.to_vec())),
                |error, list| self.unstartable_voters(error, list, &peer),
            )
            .await
            .map_err(|e| LocalError::Stack(format!("adding {id}: {e}")))?;
        self.wait_peers_know(id, etcd_id).await?;
        self.testbed.spawn_member(id, &cluster_of(etcd_id, &cluster).join(","), "existing")?;
        Ok(etcd_id)
    }

    /// Waits (within the op bound) until every other running member that answers lists the
    /// just-added member `etcd_id` in its own member list, before `id` is started. A joining
    /// member takes the cluster's membership from the first peer that answers it and exits with
    /// "member count is unequal" if that peer has not applied the add yet (etcd-io/etcd#10002):
    /// a member that had just joined applied it 0.46 s after the add returned, and the new
    /// member, started at once, asked it first and died. A member that does not answer is not
    /// waited for: the new member cannot get an answer from it either.
    async fn wait_peers_know(&self, id: MemberId, etcd_id: u64) -> Result<(), LocalError> {
        let deadline = Instant::now() + self.bounds.op;
        let peers: Vec<(MemberId, String)> =
            self.testbed.members.iter().filter(|(m, b)| **m != id && b.pid().is_some()).map(|(m, b)| (*m, b.client_url())).collect();
        let request = self.bounds.request;
        loop {
            let lists = futures_join_all(peers.iter().cloned().map(|(m, url)| async move {
                let list = async {
                    let mut c = etcd::connect(&url, request).await?;
                    etcd::bounded("member list", request, c.member_list()).await
                };
                (m, list.await.map(|l| l.members().iter().any(|x| x.id() == etcd_id)))
            }))
            .await;
            let behind: Vec<String> = lists.iter().filter(|(_, knows)| matches!(knows, Ok(false))).map(|(m, _)| m.to_string()).collect();
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LocalError::Stack(format!(
                    "adding {id}: member(s) {} still do not list it {:?} after the add returned",
                    behind.join(", "),
                    self.bounds.op
                )));
            }
            tracing::debug!(member = %id, behind = ?behind, "waiting for the peers to apply the member add");
            tokio::time::sleep(PEERS_KNOW_POLL).await;
        }
    }

    /// Why etcd will not let a voting member be added while nothing in this op changes the
    /// cluster, if so: it refuses an add unless every voting member is connected ("unhealthy
    /// cluster") and enough are started, and a voting member of its list that the testbed runs
    /// no process for (a member forgotten in the list, or stopped) stays away until removed or
    /// started. (`adding`: the peer URL being added, not counted.) Without this the add was
    /// retried until the op bound, 45 s and more, before the op failed the same way.
    fn unstartable_voters(&self, error: &str, list: &[etcd_client::Member], adding: &str) -> Option<String> {
        if !error.contains("unhealthy cluster") && !error.contains("not enough started members") {
            return None;
        }
        let running: Vec<String> = self.testbed.members.values().filter(|m| m.pid().is_some()).map(|m| m.peer_url()).collect();
        let away: Vec<String> = list
            .iter()
            .filter(|m| !m.is_learner() && !m.peer_urls().iter().any(|u| u == adding || running.contains(u)))
            .map(|m| format!("{} ({})", if m.name().is_empty() { "unstarted" } else { m.name() }, m.peer_urls().join(",")))
            .collect();
        (!away.is_empty()).then(|| format!("etcd's member list holds voting member(s) no process runs: {} — etcd counts them, so it will not allow the add until they are removed or started", away.join(", ")))
    }

    /// On the control-plane stack, waits (within the op bound) until machine `id`'s apiserver is
    /// ready, before a rolling op moves to the next machine: `kubeadm upgrade node` waits for its
    /// restarted static pods, and KubeadmControlPlane for a new machine's control plane, before
    /// the next. Without the wait every apiserver restarted within seconds of the others, and
    /// the API was down through the load balancer for as long as their start-up took. Nothing to
    /// wait for on the etcd stack.
    pub(super) async fn wait_apiserver_ready(&mut self, id: MemberId, what: &str) -> Result<(), LocalError> {
        let deadline = Instant::now() + self.bounds.op;
        self.testbed.wait_apiserver_ready(id, deadline).await.map_err(|e| LocalError::Stack(format!("{what} {id}: {e}")))
    }

    /// Waits until member `id` sees a leader and caught up with the others (bounded by the op
    /// bound), and tells the sampler it serves.
    pub(super) async fn wait_caught_up(&self, id: MemberId, what: &str) -> Result<(), LocalError> {
        let url = self.url_of(id)?;
        let others: Vec<String> = self.urls().into_iter().filter(|u| *u != url).collect();
        etcd::wait_caught_up(&url, &others, self.bounds.op).await.map_err(|e| LocalError::Stack(format!("{what} {id}: {e}")))?;
        self.confirm_serving(&url);
        Ok(())
    }

    /// etcd's member id of the member named `name`.
    pub(super) async fn etcd_id(&self, name: &str) -> Result<Option<u64>, LocalError> {
        let mut c = self.cluster_client().await?;
        let list =
            etcd::bounded("member list", self.bounds.request, c.member_list()).await.map_err(|e| LocalError::Stack(e.to_string()))?;
        Ok(list.members().iter().find(|m| m.name() == name).map(|m| m.id()))
    }

    /// Moves leadership off `id` if it leads (best effort: etcd also does it on SIGTERM).
    pub(super) async fn move_leader_off(&self, id: MemberId) {
        let Ok(url) = self.url_of(id) else { return };
        let Ok(s) = etcd::status(&url, self.bounds.request).await else { return };
        let me = s.header().map(|h| h.member_id()).unwrap_or(0);
        if s.leader() != me || me == 0 {
            return;
        }
        let Ok(mut c) = etcd::connect(&url, self.bounds.request).await else { return };
        let Ok(list) = etcd::bounded("member list", self.bounds.request, c.member_list()).await else { return };
        if let Some(to) = list.members().iter().find(|m| m.id() != me && !m.name().is_empty()) {
            let res = etcd::bounded("move leader", MOVE_LEADER_BOUND, c.move_leader(to.id())).await;
            tracing::debug!(from = %id, to = to.name(), ?res, "moved leadership");
        }
    }

    pub(super) async fn rolling_upgrade(&mut self, after: &Model) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.testbed.members.keys().copied().collect();
        for id in ids {
            let to = after.member(id).map_err(|e| LocalError::Stack(e.to_string()))?.version;
            if self.testbed.members[&id].version == to {
                continue;
            }
            self.move_leader_off(id).await;
            self.testbed.stop(id, UPGRADE_STOP_GRACE).await?;
            self.testbed.members.get_mut(&id).expect("listed above").version = to;
            let cluster = self.testbed.initial_cluster();
            self.testbed.spawn_member(id, &cluster, "existing")?;
            if !self.bug(PlantedBug::UpgradeNoWait) {
                self.wait_caught_up(id, "upgraded").await?;
                self.wait_apiserver_ready(id, "upgraded").await?;
            }
        }
        Ok(())
    }

    pub(super) async fn rolling_replace(&mut self, before: &Model, after: &Model) -> Result<(), LocalError> {
        for (old, new) in before.replacements() {
            let spec = after.member(new).map_err(|e| LocalError::Stack(e.to_string()))?.clone();
            let url = self.testbed.add_member(new, spec.site, spec.version).await?.client_url();
            if let Some(s) = &self.sampler {
                s.watch(&url);
            }
            if let Err(e) = self.announce_and_start(new, false).await {
                self.testbed.remove_member(new).await.ok();
                return Err(e);
            }
            self.wait_caught_up(new, "new member").await?;
            self.wait_apiserver_ready(new, "new member").await?;
            self.move_leader_off(old).await;
            if !self.bug(PlantedBug::ReplaceKeepsOldMember) {
                let old_id =
                    self.etcd_id(&old.to_string()).await?.ok_or_else(|| LocalError::Stack(format!("{old} is not in the member list")))?;
                self.remove_etcd_member(old_id).await.map_err(|e| LocalError::Stack(format!("removing {old}: {e}")))?;
            }
            self.testbed.stop(old, REPLACE_STOP_GRACE).await?;
            self.testbed.remove_member(old).await?;
            self.testbed.start_haproxy().await?;
        }
        Ok(())
    }

    pub(super) async fn site_outage(&mut self, site: SiteId, mode: OutageMode) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.testbed.members.values().filter(|m| m.site == site).map(|m| m.id).collect();
        match mode {
            OutageMode::PowerLoss => {
                for id in ids {
                    self.testbed.kill(id).await?;
                }
                Ok(())
            }
            OutageMode::Isolate => {
                let (table, subnet, gid) = (self.testbed.nft_table(), self.testbed.site_subnet(site), self.testbed.site_gid(site));
                nft::isolate(&table, &site.to_string(), subnet, gid).await
            }
        }
    }

    pub(super) async fn site_recover(&mut self, site: SiteId, before: &Model) -> Result<(), LocalError> {
        match before.outages.get(&site) {
            Some(OutageMode::Isolate) => {
                nft::recover(&self.testbed.nft_table(), &site.to_string(), self.bug(PlantedBug::RecoverLeavesRule)).await
            }
            Some(OutageMode::PowerLoss) => {
                let ids: Vec<MemberId> = self.testbed.members.values().filter(|m| m.site == site).map(|m| m.id).collect();
                let cluster = self.testbed.initial_cluster();
                ids.into_iter().try_for_each(|id| self.testbed.spawn_member(id, &cluster, "existing"))
            }
            None => Err(LocalError::Stack(format!("{site} is not out"))),
        }
    }

    /// What a kubelet and a CSI attacher do after a disk comes back: the member's process is
    /// killed if it still runs (it usually died on EIO), the disk unmounted, checked and mounted
    /// again, and etcd restarted on its own data ("existing"), waited for until healthy and
    /// caught up. Its data is replaced ([`Self::replace_member_data`], with a note) only when it
    /// is unusable: the remount fails, the data directory is gone, or etcd exits on it while it
    /// is waited for. Anything else (a member that runs but does not catch up) is the op failing.
    ///
    /// An earlier version always re-added the member empty: a member restarted on its data was
    /// seen to serve a stale store. That was the detach's own flavour dropping acknowledged WAL
    /// blocks (docs/findings.md, finding 2), fixed in [`super::disk::shutdown`].
    pub(super) async fn disk_reattach(&mut self, id: MemberId) -> Result<(), LocalError> {
        self.testbed.kill(id).await?;
        let cluster = self.testbed.initial_cluster();
        if self.bug(PlantedBug::ReattachOnShutdownDisk) {
            return self.testbed.spawn_member(id, &cluster, "existing");
        }
        if let Err(e) = self.testbed.remount_disk(id).await {
            self.note(format!("disk-reattach({id}): the disk could not be mounted again ({e}); its data is unusable, so the member gets a fresh disk and is re-added"));
            return self.replace_member_data(id).await;
        }
        let wal = self.testbed.members[&id].disk.data_dir().join("member").join("wal");
        if !wal.is_dir() {
            self.note(format!(
                "disk-reattach({id}): the remounted disk has no etcd data ({} is missing), so the member gets a fresh disk and is re-added",
                wal.display()
            ));
            return self.replace_member_data(id).await;
        }
        self.testbed.spawn_member(id, &cluster, "existing")?;
        match self.wait_caught_up_or_exit(id).await? {
            None => Ok(()),
            Some(status) => {
                let log = self.testbed.cfg.run_dir.join("logs").join(format!("{id}.log"));
                let tail = crate::procs::tail_lines(&log, 3);
                tracing::warn!(member = %id, %status, "etcd exited on its own data after the disk was reattached; re-adding it");
                self.note(format!(
                    "disk-reattach({id}): etcd exited ({status}) on its own data after the remount, so the member gets a fresh disk and is re-added; the end of {}:\n{}",
                    log.display(),
                    tail.trim_end()
                ));
                self.replace_member_data(id).await
            }
        }
    }

    /// Waits until member `id` sees a leader and caught up with the others (bounded by the op
    /// bound) and tells the sampler it serves — `None` — unless its process exits first: then
    /// its exit status.
    async fn wait_caught_up_or_exit(&mut self, id: MemberId) -> Result<Option<std::process::ExitStatus>, LocalError> {
        let url = self.url_of(id)?;
        let others: Vec<String> = self.urls().into_iter().filter(|u| *u != url).collect();
        let caught_up = etcd::wait_caught_up(&url, &others, self.bounds.op);
        tokio::pin!(caught_up);
        loop {
            tokio::select! {
                res = &mut caught_up => {
                    res.map_err(|e| LocalError::Stack(format!("reattached {id} on its own data: {e}")))?;
                    self.confirm_serving(&url);
                    return Ok(None);
                }
                _ = tokio::time::sleep(EXIT_POLL) => {
                    if let Some(status) = self.testbed.exit_status(id) {
                        return Ok(Some(status));
                    }
                }
            }
        }
    }

    /// `disk-replace`, the operator's recovery after a lost disk (and `disk-reattach`'s when the
    /// data is unusable): the member's data is thrown away — its process killed, a fresh, empty
    /// disk in place of its old one — then it is removed from the cluster and added back empty as
    /// a learner (which does not count towards quorum while it syncs), promoted once in sync, and
    /// waited for until caught up. etcd gives it a new member id.
    pub(super) async fn replace_member_data(&mut self, id: MemberId) -> Result<(), LocalError> {
        self.testbed.kill(id).await?;
        self.testbed.replace_disk(id).await?;
        let name = id.to_string();
        if let Some(etcd_id) = self.etcd_id(&name).await? {
            self.remove_etcd_member(etcd_id).await.map_err(|e| LocalError::Stack(format!("removing {id}: {e}")))?;
        }
        let etcd_id = self.announce_and_start(id, true).await?;
        // etcd refuses the promotion until the learner is in sync: retried within the op bound.
        self.reconfigure(
            "member promote",
            |mut c| async move { c.member_promote(etcd_id).await.map(|_| ()) },
            |list| list.iter().any(|m| m.id() == etcd_id && !m.is_learner()).then_some(()),
            |_, _| None,
        )
        .await
        .map_err(|e| LocalError::Stack(format!("promoting {id}: {e}")))?;
        self.wait_caught_up(id, "re-added").await
    }

    /// `defrag(mN)`: etcd's maintenance Defragment on the member itself (a defrag is per member),
    /// bounded by the op bound, then the member must answer and be caught up with the others. The
    /// database sizes before and after (bytes, from etcd's status) and the time it took go into a
    /// `defrag` note in the event log: the evidence that etcd rewrote its backend.
    pub(super) async fn defrag(&mut self, id: MemberId) -> Result<(), LocalError> {
        let url = self.url_of(id)?;
        let stack = |e: etcd::EtcdError| LocalError::Stack(format!("defrag {id}: {e}"));
        let sizes = |s: &etcd_client::StatusResponse| json!({ "db_size": s.db_size(), "in_use": s.raft_used_db_size() });
        let before = etcd::status(&url, self.bounds.request).await.map_err(stack)?;
        // A defrag copies the whole database: its one request gets the op's bound, not a request's.
        let mut c = etcd::connect(&url, self.bounds.op).await.map_err(stack)?;
        let started = Instant::now();
        etcd::bounded("defragment", self.bounds.op, c.defragment()).await.map_err(stack)?;
        let took = started.elapsed();
        let after = etcd::status(&url, self.bounds.request).await.map_err(stack)?;
        self.wait_caught_up(id, "defragmented").await?;
        let detail = json!({ "member": id.to_string(), "before": sizes(&before), "after": sizes(&after), "ms": took.as_millis() as u64 });
        tracing::debug!(member = %id, %detail, "defragmented");
        self.log.push(crate::targets::Note { kind: "defrag".into(), detail });
        Ok(())
    }

    /// Whether `partition-until-snapshot` can run here: nftables (root, loop disks: the member's
    /// own group id), a `[etcd] snapshot_count` small enough for the op's bound, and the member
    /// alone in its site (its packets are told apart by the site's group id).
    pub(super) fn partition_until_snapshot_supported(&self, op: &Op) -> Result<(), crate::targets::Unsupported> {
        if self.testbed.cfg.disks != DiskMode::Loop {
            return Err("cutting a member's peer traffic needs root (nftables and per-site group ids)".into());
        }
        nft::available()?;
        match self.testbed.cfg.etcd.snapshot_count {
            Some(n) if n <= MAX_SNAPSHOT_COUNT_TO_OUTRUN => {}
            Some(n) => {
                return Err(format!(
                    "partition-until-snapshot holds the cut while the others apply snapshot_count + 5,000 entries: [etcd] snapshot_count = {n} is more than the {MAX_SNAPSHOT_COUNT_TO_OUTRUN} it waits for"
                )
                .into())
            }
            None => {
                return Err("partition-until-snapshot needs [etcd] snapshot_count in the profile (at most 10,000): with etcd's default of 100,000 the others would have to apply 105,000 entries first".into())
            }
        }
        let Some(id) = op.member() else { return Ok(()) };
        let site = self.testbed.members.get(&id).map(|m| m.site);
        if self.testbed.members.values().filter(|m| Some(m.site) == site).count() > 1 {
            return Err(format!("{id} shares its site with another member: its peer traffic cannot be told apart from theirs").into());
        }
        Ok(())
    }

    /// `partition-until-snapshot(mN)`: the member's raft traffic cut ([`nft::cut_peer`]); filler
    /// writes (one key of the run's own, outside the workload's prefix) through the others until
    /// each of them has compacted its raft log past the member's index (their logs say so: each
    /// compacts after a snapshot, to 5,000 entries behind it, and a leader that sent a snapshot
    /// in the last 30 s does not compact at all); the cut lifted; then the member must be caught
    /// up and its log must say it received a snapshot. A member that caught up without one has
    /// not been brought where the op promises: the cut is made once more
    /// ([`SNAPSHOT_PARTITION_ATTEMPTS`]; the note counts the attempts and keeps each one that
    /// missed), and a member that catches up without a snapshot again fails the op.
    pub(super) async fn partition_until_snapshot(&mut self, id: MemberId) -> Result<(), LocalError> {
        let log = self.member_log(id)?;
        let mut missed = vec![];
        for attempt in 1..=SNAPSHOT_PARTITION_ATTEMPTS {
            let received_before = observe::snapshots_received_in(&log);
            let (behind, reached) = self.cut_until_outrun(id, "partition-until-snapshot").await?;
            self.wait_caught_up(id, "back from partition-until-snapshot").await?;
            let received = observe::snapshots_received_in(&log);
            if received > received_before {
                self.log.push(crate::targets::Note {
                    kind: "partition-until-snapshot".into(),
                    detail: json!({ "member": id.to_string(), "cut_at_index": behind, "others_reached": reached, "snapshots_received": received - received_before, "attempts": attempt, "missed": missed }),
                });
                return Ok(());
            }
            // Seen on 3.5.16 while the cut only dropped packets: what the leader had written to
            // the open connections during it was delivered after it (docs/findings.md, "A member
            // cut off past the leader's log…"). The cut now resets them; what a burst in flight
            // at the cut can still do is covered here.
            tracing::warn!(member = %id, behind, reached, attempt, "partition-until-snapshot: caught up without a snapshot from the leader");
            missed.push(json!({ "cut_at_index": behind, "others_reached": reached }));
        }
        Err(LocalError::Stack(format!(
            "partition-until-snapshot {id}: caught up without a snapshot from the leader {SNAPSHOT_PARTITION_ATTEMPTS} times (cut at raft index, the others' index: {}; each time the others had compacted their logs past it)",
            missed.iter().map(|m| format!("{}, {}", m["cut_at_index"], m["others_reached"])).collect::<Vec<_>>().join("; ")
        )))
    }

    /// Member `id`'s log file (its etcd's stderr, kept across restarts).
    pub(super) fn member_log(&self, id: MemberId) -> Result<std::path::PathBuf, LocalError> {
        let m = self.testbed.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        Ok(self.testbed.cfg.run_dir.join("logs").join(format!("{}.log", m.name())))
    }

    /// The cut of `partition-until-snapshot` (and of the snapshot paths' failpoints): the
    /// member's raft traffic cut, filler writes through the others until each has compacted its
    /// raft log past the member's index, the cut lifted (whatever happened meanwhile). From here
    /// the leader can only send the member a snapshot. Returns the member's raft index at the cut
    /// and the others' at the end.
    pub(super) async fn cut_until_outrun(&mut self, id: MemberId, what: &str) -> Result<(u64, u64), LocalError> {
        let deadline = Instant::now() + self.bounds.op;
        let snapshot_count = self.testbed.cfg.etcd.snapshot_count.unwrap_or(0);
        let m = self.testbed.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        let (ip, site, url) = (m.ip, m.site, m.client_url());
        let logs = self.testbed.cfg.run_dir.join("logs");
        let other_logs: Vec<std::path::PathBuf> =
            self.testbed.members.values().filter(|o| o.id != id).map(|o| logs.join(format!("{}.log", o.name()))).collect();
        let stack = |e: etcd::EtcdError| LocalError::Stack(format!("{what} {id}: {e}"));
        let table = self.testbed.nft_table();
        nft::cut_peer(&table, &id.to_string(), ip, self.testbed.site_gid(site), PEER_PORT).await?;
        let res = async {
            let behind = etcd::status(&url, self.bounds.request).await.map_err(stack)?.raft_index();
            let others: Vec<String> = self.urls().into_iter().filter(|u| *u != url).collect();
            let others = self.answering(others).await;
            if others.is_empty() {
                return Err(LocalError::Stack(format!("{what} {id}: no other member answers")));
            }
            let fill_key = format!("/shakedown/{}/snapshot-fill", self.testbed.cfg.run_id);
            let reached = fill_until(&others, &fill_key, other_logs, (&url, behind), deadline, self.bounds.request).await.map_err(|e| {
                LocalError::Stack(format!("{what} {id} (cut at raft index {behind}, snapshot_count {snapshot_count}): {e}"))
            })?;
            tracing::debug!(member = %id, behind, reached, "{what}: the others compacted past it");
            Ok::<_, LocalError>((behind, reached))
        }
        .await;
        // The cut is lifted whatever happened while it held.
        nft::heal_peer(&table, &id.to_string()).await?;
        res
    }

    pub(super) fn backup_path(&self, b: BackupId) -> std::path::PathBuf {
        self.testbed.cfg.run_dir.join("backups").join(format!("{b}.db"))
    }

    pub(super) async fn backup(&mut self, after: &Model) -> Result<(), LocalError> {
        let b = *after.backups.last().ok_or_else(|| LocalError::Stack("the model has no backup to take".into()))?;
        let path = self.backup_path(b);
        std::fs::create_dir_all(path.parent().expect("has a parent"))
            .map_err(|e| LocalError::Environment(format!("cannot create the backup store: {e}")))?;
        let deadline = Instant::now() + self.bounds.op;
        let start = self.workload.acked_len();
        let api_start = self.api.as_ref().map(|a| a.workload.acked_len());
        // From the leader first (it has applied every acknowledged write; a follower may lag),
        // then from the other members the model says answer. Like an operator, the op tries the
        // next source when a snapshot stream breaks: a member whose disk has just been shut down
        // can still lead for a moment and then die mid-stream (seen: "transport error … broken
        // pipe" right after disk-detach). A member whose disk the model knows is detached is
        // never a source. Every source failing is the op failing.
        let mut tried = vec![];
        for url in self.backup_sources(after).await {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let res = match etcd::connect(&url, self.bounds.request).await {
                Ok(mut c) => backup::take(&mut c, &path, left).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match res {
                Ok(size) => {
                    // The workload's one write in flight when the snapshot ended may be in it and be
                    // acknowledged just after: it is the next position, so the snapshot's window ends
                    // after it (seen as a false "restore did not restore" with a 2 ms workload interval).
                    // A failed attempt before this one only widens the window (it starts earlier).
                    self.marks.backup_taken(b, start, self.workload.acked_len() + 1);
                    if let (Some(api), Some(api_start)) = (&mut self.api, api_start) {
                        // The API's writes are etcd writes under /registry: in the snapshot too.
                        api.workload.backup_taken(b, api_start);
                    }
                    if !tried.is_empty() {
                        self.note(format!("backup {b} taken from {url} after {} failed source(s): {}", tried.len(), tried.join("; ")));
                    }
                    tracing::debug!(backup = %b, bytes = size, source = %url, "backup taken");
                    return Ok(());
                }
                Err(e) => tried.push(format!("{url}: {e}")),
            }
        }
        if tried.is_empty() {
            return Err(LocalError::Stack(format!("backup {b}: no member the model says answers could be asked for a snapshot")));
        }
        Err(LocalError::Stack(format!("backup {b} failed from every source: {}", tried.join("; "))))
    }

    /// Client URLs to take a snapshot from: the leader first, then the other members that answer
    /// a status request, only among members the model says run on an attached disk.
    async fn backup_sources(&self, model: &Model) -> Vec<String> {
        let healthy: Vec<String> = model
            .members
            .values()
            .filter(|m| model.answers(m) == shakedown_faults::Answers::Yes)
            .filter_map(|m| self.url_of(m.id).ok())
            .collect();
        self.answering(healthy).await
    }

    pub(super) async fn restore(&mut self, b: BackupId) -> Result<(), LocalError> {
        let path = self.backup_path(b);
        // Refuse a damaged backup before touching the running cluster.
        backup::verify(&path).map_err(|e| LocalError::Stack(format!("restore refused, the cluster was left untouched: {e}")))?;
        let version = self.testbed.members.values().map(|m| m.version).max().ok_or_else(|| LocalError::Stack("no members".into()))?;
        let tool = self.testbed.cfg.binaries.etcd.get(&version).and_then(|e| e.restore_tool.clone()).ok_or_else(|| {
            LocalError::Environment(format!("no snapshot restore tool (etcdutl or etcdctl) beside the etcd {version} binary"))
        })?;
        // Recorded before anything stops, open-ended until the stack is back: if the restore
        // fails or is cut short, every write from its start on is uncertain.
        self.marks.restore_begins(b, self.workload.acked_len());
        // The apiservers are stopped for the restore and started after it (kubeadm's procedure):
        // every watch through them breaks, and its client relists. With the planted bug
        // restore-keeps-apiservers nothing breaks them.
        let api_restarted = !self.bug(PlantedBug::RestoreKeepsApiservers);
        if let Some(api) = &mut self.api {
            api.workload.restore_begins(b, api_restarted);
        }
        // Watches start new sessions and the leases granted so far are no longer judged: the
        // restored store has the backup's revisions and lease table.
        self.workload.restored(self.bug(PlantedBug::RestoreKeepsWatches));
        let mut res = self.restore_cluster(&tool, &path, b).await;
        // A restore is done when the control plane serves again: its apiservers, restarted
        // together (kubeadm's procedure), are waited for as bring-up waits for them.
        if res.is_ok() && api_restarted {
            let deadline = Instant::now() + self.bounds.op;
            res = self.testbed.wait_apiservers_ready(deadline).await.map_err(|e| LocalError::Stack(format!("restored: {e}")));
        }
        self.marks.restore_ends(self.workload.acked_len());
        if let Some(api) = &mut self.api {
            api.workload.restore_ends(api_restarted);
        }
        self.workload.restored(self.bug(PlantedBug::RestoreKeepsWatches));
        res
    }

    pub(super) async fn restore_cluster(&mut self, tool: &std::path::Path, path: &std::path::Path, b: BackupId) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.testbed.members.keys().copied().collect();
        // The data is about to be replaced: a hard stop (a graceful one hangs on the last member,
        // which has no quorum left to hand leadership over).
        for &id in &ids {
            if self.bug(PlantedBug::RestoreKeepsApiservers) {
                // Planted bug: the apiservers are left running across the restore.
                self.testbed.kill_member_only(id).await?;
            } else {
                self.testbed.kill(id).await?;
            }
        }
        // Every member is down: whatever answers from now on is the restored store.
        self.workload.store_replaced();
        if let Some(api) = &self.api {
            api.workload.store_replaced();
        }
        self.restores += 1;
        let token = format!("{}-r{}", self.testbed.cfg.run_id, self.restores);
        let cluster = self.testbed.initial_cluster();
        let restored: Vec<MemberId> = if self.bug(PlantedBug::RestorePartial) { ids[..ids.len() - 1].to_vec() } else { ids.clone() };
        // Planted bug restore-mixed-backups: the last member is restored from the backup before
        // this one (as a tool that picks "each member's latest local backup" does).
        let older =
            b.0.checked_sub(1).map(|i| self.backup_path(BackupId(i))).filter(|p| self.bug(PlantedBug::RestoreMixedBackups) && p.is_file());
        for (n, &id) in restored.iter().enumerate() {
            self.testbed.replace_disk(id).await?;
            let m = &self.testbed.members[&id];
            let data = m.disk.data_dir();
            let _ = std::fs::remove_dir_all(&data);
            let from = match &older {
                Some(o) if n + 1 == restored.len() => o.as_path(),
                _ => path,
            };
            backup::restore_into(tool, from, &m.name(), &cluster, &token, &m.peer_url(), &data).await?;
        }
        for &id in &ids {
            self.testbed.spawn_member(id, &cluster, "new")?;
        }
        let urls = self.urls();
        for url in &urls {
            etcd::wait_caught_up(url, &urls, self.bounds.converge)
                .await
                .map_err(|e| LocalError::Stack(format!("after restoring {b}: {e}")))?;
            self.confirm_serving(url);
        }
        Ok(())
    }
}

/// How far past the member's raft index the others must have compacted their logs: the member's
/// log may hold a few entries beyond its commit index.
const COMPACTED_PAST_MARGIN: u64 = 100;
/// How many times `partition-until-snapshot` cuts a member that came back without the leader's
/// snapshot before the op fails.
const SNAPSHOT_PARTITION_ATTEMPTS: u32 = 2;
/// The largest `[etcd] snapshot_count` `partition-until-snapshot` outruns (at a few thousand
/// filler writes a second, about ten seconds of them).
pub(super) use shakedown_faults::profile::MAX_SNAPSHOT_COUNT_TO_OUTRUN;
/// Concurrent filler writers.
const FILLERS: usize = 8;
/// How often the others' logs are read for their compactions.
const COMPACTION_POLL: Duration = Duration::from_millis(200);

/// [`FILLERS`] writers putting to one key through the members at `urls` (each writer through
/// one, round-robin) until stopped or `deadline`. Writes that fail are retried while the
/// deadline allows (an election may be under way, a member may have gone).
pub(super) struct Fillers {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: tokio::task::JoinSet<String>,
}

impl Fillers {
    pub(super) fn start(urls: &[String], key: &str, deadline: Instant, request: Duration) -> Fillers {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..FILLERS {
            let (url, key, done) = (urls[w % urls.len()].clone(), key.to_string(), done.clone());
            tasks.spawn(async move {
                let mut client = None;
                let mut last = String::new();
                let mut i = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                    if client.is_none() {
                        client = etcd::connect(&url, request).await.map_err(|e| last = e.to_string()).ok();
                    }
                    let Some(c) = client.as_mut() else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    i += 1;
                    if let Err(e) = etcd::bounded("put", request, c.put(key.as_str(), format!("{w}-{i}"), None)).await {
                        last = e.to_string();
                        client = None;
                    }
                }
                last
            });
        }
        Fillers { done, tasks }
    }

    /// Stops the writers and waits for them; returns each one's last error, if any.
    pub(super) async fn stop(mut self) -> Vec<String> {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut errors = vec![];
        while let Some(r) = self.tasks.join_next().await {
            if let Ok(last) = r {
                if !last.is_empty() {
                    errors.push(last);
                }
            }
        }
        errors
    }
}

/// Writes to `key` through the members at `urls` (each writer through one, round-robin) until
/// every log in `logs` says its member compacted its raft log to at least
/// [`COMPACTED_PAST_MARGIN`] past the cut member's raft index — the higher of `behind` (read at
/// the cut) and what the member (at `member`, still answering its clients) reports now: entries
/// already in flight when the cut was made may land after it — or `deadline`. Returns the
/// highest raft index the others report at the end. Writes that fail are retried while the
/// deadline allows (an election may be under way).
async fn fill_until(
    urls: &[String],
    key: &str,
    logs: Vec<std::path::PathBuf>,
    (member, behind): (&str, u64),
    deadline: Instant,
    request: Duration,
) -> Result<u64, String> {
    let fillers = Fillers::start(urls, key, deadline, request);
    let mut compactions = observe::CompactionsInLogs::from_now(logs);
    let (mut compacted, mut past) = (0, behind + COMPACTED_PAST_MARGIN);
    while Instant::now() < deadline {
        compacted = compactions.poll();
        if compacted >= past {
            // Where the member is now (it may have appended what was in flight at the cut).
            match etcd::status(member, request).await {
                Ok(s) if s.raft_index() + COMPACTED_PAST_MARGIN > past => past = s.raft_index() + COMPACTED_PAST_MARGIN,
                _ => break,
            }
            if compacted >= past {
                break;
            }
        }
        tokio::time::sleep(COMPACTION_POLL).await;
    }
    let mut errors = fillers.stop().await;
    // Where the others are now.
    let mut reached = 0;
    for url in urls {
        if let Ok(s) = etcd::status(url, request).await {
            reached = reached.max(s.raft_index());
        }
    }
    if compacted < past {
        errors.dedup();
        return Err(format!(
            "the others had compacted their raft logs only to {compacted} of {past} (raft index {reached}) at the op's bound (last errors: {})",
            if errors.is_empty() { "none".to_string() } else { errors.join("; ") }
        ));
    }
    Ok(reached)
}
