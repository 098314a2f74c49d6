//! The local target: a real stack on this machine (see [`testbed`]), faults done for real
//! (SIGKILL, SIGSTOP, rolling restarts onto another etcd binary, member add/remove), observed
//! through the etcd API.

mod api;
pub mod apiserver;
pub mod backup;
pub mod bugs;
pub mod disk;
pub mod etcd;
mod failpoint;
pub mod nft;
pub(crate) mod observe;
mod ops;
pub mod reap;
mod sampler;
pub mod spec;
pub mod testbed;
pub mod workload;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use shakedown_faults::{Model, Op, OpKind, OutageMode, Profile};
use shakedown_invariants::{InvariantId, Marks, Observation};

use crate::exit::Fatal;
pub use crate::targets::TargetError as LocalError;
use crate::targets::{Coverage, StartContext, Started, Target};
pub use bugs::PlantedBug;
pub use disk::DiskMode;
use sampler::Sampler;
pub use spec::{DiskArg, Environment, LocalOptions, LocalSpec};
pub use testbed::{Testbed, TestbedConfig, ELECTION_MS, HEARTBEAT_MS};
use workload::Workload;

/// How long the local stack may take to come up (every member healthy, HAProxy serving).
pub const BRING_UP_BOUND: Duration = Duration::from_secs(30);
/// One status, hash or member-list request to one member.
pub const REQUEST_BOUND: Duration = Duration::from_millis(500);
/// How often the serving sampler polls each member during a step.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// A graceful stop of a member being upgraded (SIGTERM, then SIGKILL).
pub const UPGRADE_STOP_GRACE: Duration = Duration::from_secs(10);
/// A graceful stop of a member a rolling replace removed.
pub const REPLACE_STOP_GRACE: Duration = Duration::from_secs(5);
/// Moving leadership off a member about to stop (best effort).
pub const MOVE_LEADER_BOUND: Duration = Duration::from_secs(3);
/// Reading back every acknowledged write takes at least this long a bound (a big prefix).
pub const READ_BACK_MIN_BOUND: Duration = Duration::from_secs(2);
/// Rounds of endpoint probes a check makes at most until every member has answered one.
pub const PROBE_ROUNDS: usize = 3;
/// How long a refused membership change waits before it is tried again.
pub const RECONFIGURE_RETRY: Duration = Duration::from_millis(50);
/// How often the members are asked whether they applied a member add, before the new member starts.
pub const PEERS_KNOW_POLL: Duration = Duration::from_millis(50);
/// How often a member restarted on its reattached disk is checked for having exited while it is
/// waited for (etcd refusing its data exits within a second or so).
pub const EXIT_POLL: Duration = Duration::from_millis(50);

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
        LocalBounds {
            request: REQUEST_BOUND,
            probe: p.timeouts.probe,
            op: p.timeouts.op,
            converge: p.timeouts.converge,
            sample_every: SAMPLE_EVERY,
        }
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
    /// Notes for the run's event log (`local-note`: what an op had to work around).
    log: Vec<crate::targets::Note>,
    /// The control-plane stack's API: its workload and probes (`None`: the etcd stack).
    api: Option<api::LocalApi>,
}

impl LocalTarget {
    /// Records a note in the run's event log (and the debug log).
    pub(crate) fn note(&mut self, text: String) {
        tracing::info!("{text}");
        self.log.push(crate::targets::Note { kind: "local-note".into(), detail: serde_json::Value::String(text) });
    }

    /// Brings the stack up and starts the workload. `profile` is the one the plan runs with
    /// ([`shakedown_faults::Plan::run_profile`]): its `[etcd]` are the flags every member starts
    /// with, those drawn for the plan's seed included.
    pub async fn start(cfg: TestbedConfig, profile: &Profile, model: &Model, bring_up_limit: Duration) -> Result<LocalTarget, LocalError> {
        if !profile.etcd.draw.is_empty() {
            // Started from the profile rather than the plan: the drawn flags would be left out.
            return Err(LocalError::Environment(format!(
                "profile {} still has etcd flags to draw: the local stack starts with the flags of a plan (Plan::run_profile)",
                profile.name
            )));
        }
        let bug = cfg.bug;
        let prefix = format!("/shakedown/{}/w/", cfg.run_id);
        let samples = cfg.run_dir.join("workload.csv");
        let mut cfg = cfg;
        cfg.stack = profile.stack;
        cfg.etcd = profile.etcd.clone();
        if let Some(h) = profile.etcd.heartbeat {
            cfg.heartbeat_ms = h.as_millis() as u32;
        }
        if let Some(e) = profile.etcd.election {
            cfg.election_ms = e.as_millis() as u32;
        }
        let testbed = Testbed::up(cfg, model, bring_up_limit).await?;
        let api = match testbed.api {
            Some(_) => Some(api::LocalApi::start(&testbed, &profile.api).await?),
            None => None,
        };
        let bugs = workload::ClientBugs {
            ack_before_write: bug == Some(PlantedBug::AckBeforeWrite),
            ignore_conflict: bug == Some(PlantedBug::TxnIgnoresConflict),
            resume_from_now: bug == Some(PlantedBug::WatchResumeFromNow),
            lease_keys_unattached: bug == Some(PlantedBug::LeaseKeysUnattached),
            serializable_reads: bug == Some(PlantedBug::SerializableReads),
        };
        let members: Vec<String> = testbed.members.values().map(|m| m.client_url()).collect();
        let workload = Workload::start(testbed.endpoint_url(), &members, prefix, &profile.workload, bugs, Some(&samples));
        Ok(LocalTarget {
            testbed,
            workload,
            bounds: LocalBounds::from_profile(profile),
            sampler: None,
            marks: Marks::default(),
            restores: 0,
            log: vec![],
            api,
        })
    }

    /// Brings the stack of `spec` up with the binaries and disks `targets::prepare` found.
    pub async fn start_spec(spec: &LocalSpec, env: Environment, ctx: &StartContext<'_>) -> Result<LocalTarget, Fatal> {
        let (binaries, disks) = env;
        let cfg = TestbedConfig::new(ctx.run_id, ctx.run_dir, binaries, disks, spec.testbed_bug);
        LocalTarget::start(cfg, ctx.profile, ctx.model, BRING_UP_BOUND)
            .await
            .map_err(|e| Fatal::environment(format!("cannot bring the local stack up: {e}")))
    }

    fn bug(&self, bug: PlantedBug) -> bool {
        self.testbed.cfg.bug == Some(bug)
    }
}

/// Joins futures concurrently, in order (a tiny join_all, to avoid a dependency for one call).
async fn futures_join_all<F>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("observation task does not panic"));
    }
    out
}

impl LocalTarget {
    /// The workload's history, with member names for the ids seen in member lists.
    fn history(&self) -> shakedown_history::History {
        self.workload.requests()
    }

    /// Writes the run's history into the run directory (`history.jsonl`, checked by
    /// `shakedown check-history`).
    fn write_history(&self) {
        let path = self.testbed.cfg.run_dir.join("history.jsonl");
        if let Err(e) = std::fs::write(&path, self.history().to_jsonl()) {
            tracing::warn!("cannot write the history to {}: {e}", path.display());
        }
    }
}

#[async_trait::async_trait]
impl Target for LocalTarget {
    fn name(&self) -> &'static str {
        "local"
    }

    fn started(&self) -> Started {
        let endpoint = self.testbed.endpoint_url();
        match &self.api {
            None => Started { line: format!("endpoint {endpoint}"), fields: json!({"endpoint": endpoint}), notes: vec![] },
            Some(api) => {
                let lb = self.testbed.api_endpoint_url();
                Started {
                    line: format!("etcd endpoint {endpoint} · API load balancer {lb} · kubeconfig {}", api.kubeconfig.display()),
                    fields: json!({"endpoint": endpoint, "api_endpoint": lb, "kubeconfig": api.kubeconfig}),
                    notes: vec![],
                }
            }
        }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn coverage(&self, id: InvariantId) -> Coverage {
        match id {
            InvariantId::Membership
            | InvariantId::Leaks
            | InvariantId::Members
            | InvariantId::Quorum
            | InvariantId::Consistency
            | InvariantId::Reachability
            | InvariantId::Durability
            | InvariantId::Linearizability => Coverage::Checked,
            InvariantId::Watch if self.workload.watchers() > 0 => Coverage::Checked,
            InvariantId::Watch => {
                Coverage::Unchecked("the workload runs no watches (workload.kind = \"kube\" with workload.watches > 0 does)".into())
            }
            InvariantId::Leases if self.workload.lease_prefix().is_some() => Coverage::Checked,
            InvariantId::Leases => Coverage::Unchecked("the workload grants no leases (workload.kind = \"kube\" does)".into()),
            InvariantId::ApiReachability | InvariantId::ApiDurability | InvariantId::ApiWatch | InvariantId::ApiLinearizability
                if self.api.is_some() =>
            {
                Coverage::Checked
            }
            InvariantId::ApiReachability | InvariantId::ApiDurability | InvariantId::ApiWatch | InvariantId::ApiLinearizability => {
                Coverage::Unchecked("needs a Kubernetes API: a profile with stack = \"control-plane\"".into())
            }
            InvariantId::AppReady | InvariantId::AppDurability | InvariantId::AppLinearizability => {
                Coverage::Unchecked("only the application target (--target app) checks an application".into())
            }
        }
    }

    fn component_versions(&self) -> BTreeMap<String, String> {
        let b = &self.testbed.cfg.binaries;
        let mut v: BTreeMap<String, String> = b.etcd.iter().map(|(k, e)| (format!("etcd-{k}"), e.named_version())).collect();
        v.insert("haproxy".into(), b.haproxy_version.clone());
        if let (Some((_, version)), Some(_)) = (&b.kube_apiserver, &self.api) {
            v.insert("kube-apiserver".into(), version.clone());
        }
        v.insert("disks".into(), format!("{:?}", self.testbed.cfg.disks).to_lowercase());
        v
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn supports(&self, op: &Op) -> Result<(), super::Unsupported> {
        let root = self.testbed.cfg.disks == DiskMode::Loop;
        match op.kind() {
            OpKind::SiteOutage if matches!(op, Op::SiteOutage { mode: OutageMode::Isolate, .. }) && !root => {
                Err("site isolation needs root (nftables and per-site group ids)".into())
            }
            OpKind::SiteOutage if matches!(op, Op::SiteOutage { mode: OutageMode::Isolate, .. }) => nft::available(),
            OpKind::DiskDetach | OpKind::DiskReattach | OpKind::DiskReplace if !root => {
                Err("disk faults need loop-mounted disks (root)".into())
            }
            OpKind::Crash
            | OpKind::Restart
            | OpKind::Pause
            | OpKind::Resume
            | OpKind::RollingUpgrade
            | OpKind::RollingReplace
            | OpKind::SiteOutage
            | OpKind::SiteRecover
            | OpKind::DiskDetach
            | OpKind::DiskReattach
            | OpKind::Backup
            | OpKind::Restore
            | OpKind::DiskReplace
            | OpKind::Defrag => Ok(()),
            OpKind::PartitionUntilSnapshot => self.partition_until_snapshot_supported(op),
            OpKind::Failpoint => self.failpoint_supported(op),
            OpKind::PodKill
            | OpKind::OperatorRestart
            | OpKind::PvcLoss
            | OpKind::Partition
            | OpKind::PartitionHeal
            | OpKind::PodKillSelected
            | OpKind::NodeDrain
            | OpKind::PodFailure
            | OpKind::Switchover
            | OpKind::Taint
            | OpKind::RestorePitr
            | OpKind::PartitionGroups
            | OpKind::PartitionGroupsHeal => Err("an application op: it runs on --target app".into()),
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
                Op::Crash { member } => self.testbed.kill(member).await,
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
                Op::DiskReplace { member } => self.replace_member_data(member).await,
                Op::Defrag { member } => self.defrag(member).await,
                Op::PartitionUntilSnapshot { member } => self.partition_until_snapshot(member).await,
                Op::Failpoint { member, failpoint, action } => self.failpoint(member, failpoint, action).await,
                Op::PodKill { .. }
                | Op::OperatorRestart
                | Op::PvcLoss { .. }
                | Op::Partition { .. }
                | Op::PartitionHeal { .. }
                | Op::PodKillSelected { .. }
                | Op::NodeDrain { .. }
                | Op::PodFailure { .. }
                | Op::Switchover { .. }
                | Op::Taint { .. }
                | Op::RestorePitr { .. }
                | Op::PartitionGroups { .. }
                | Op::PartitionGroupsHeal { .. } => Err(LocalError::Unsupported(format!("{op} is an application op (--target app)"))),
            }
        })
        .await
        .unwrap_or_else(|_| Err(LocalError::Stack(format!("{op} did not finish within {}s", limit.as_secs()))));
        res
    }

    fn take_notes(&mut self) -> Vec<crate::targets::Note> {
        std::mem::take(&mut self.log)
    }

    async fn end_step(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.finish().await;
        }
    }

    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        self.testbed.supervise_apiservers();
        for text in self.testbed.take_supervision() {
            self.note(text);
        }
        let mut obs = self.observation(model, invariants).await;
        if let Some(api) = &mut obs.api {
            for a in api.apiservers.iter_mut().filter(|a| !a.answered) {
                if let Some(why) = a.member.and_then(|id| self.testbed.apiserver_down_why(id)) {
                    a.detail = Some(format!("{}: {why}", a.detail.as_deref().unwrap_or("no answer")));
                }
            }
        }
        obs
    }

    fn log_files(&self) -> Vec<(String, std::path::PathBuf)> {
        let Ok(rd) = std::fs::read_dir(self.testbed.cfg.run_dir.join("logs")) else { return vec![] };
        let mut logs: Vec<(String, std::path::PathBuf)> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|f| f.strip_suffix(".log")).map(|n| (n.to_string(), e.path())))
            .collect();
        logs.sort();
        logs
    }

    fn workload_stats(&self) -> serde_json::Value {
        match &self.api {
            None => json!(self.workload.stats()),
            Some(api) => {
                let mut v = json!(self.workload.stats());
                v["api"] = json!(api.workload.stats());
                v
            }
        }
    }

    async fn teardown(&mut self) {
        self.end_step().await;
        self.workload.stop().await;
        self.write_history();
        if let Some(api) = &mut self.api {
            api.workload.stop().await;
            api.workload.write_history(&self.testbed.cfg.run_dir.join("api-history.jsonl"));
        }
        self.testbed.teardown();
        let received = observe::snapshots_received(&self.testbed.cfg.run_dir.join("logs"));
        let total: usize = received.values().sum();
        self.log.push(crate::targets::Note { kind: "etcd-snapshots".into(), detail: json!({ "received": received, "total": total }) });
    }
}
