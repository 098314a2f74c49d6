//! shakedown's invariants: pure checks of an [`Observation`] against the [`Model`].
//!
//! Architecture invariant: this crate never does IO. The targets observe; this crate judges.

pub mod observation;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use shakedown_faults::{Answers, BackupId, MemberId, Model, OutageMode};

pub use observation::{Durability, Inventory, KubeInventory, ListedMember, Marks, MemberStatus, Observation, Probe, ServingSample};

/// The shortest quorum loss during a step that counts as a violation (milliseconds).
pub const MIN_LOSS_WINDOW_MS: u64 = 25;

/// How far (in revisions) a reachable member's store may trail the most advanced member's
/// before `consistency` calls it stalled. Followers trail by a few revisions under load; a store
/// that stopped applying falls further behind with every write.
pub const MAX_REVISION_LAG: i64 = 1000;

/// How long (seconds) an object may stay in deletion before the kube target's `leaks` calls it
/// stuck (finalizers that never finish).
pub const STUCK_DELETION_SECS: u64 = 120;

/// The registered invariants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InvariantId {
    /// The etcd member list equals the model's members: nothing stale, nothing missing.
    Membership,
    /// Nothing of the run is on the machine that the model does not expect (processes, mounts,
    /// loop devices, data directories, partition rules, backup files), and the disks, data
    /// directories, rules and backups it expects are there.
    Leaks,
    /// Every member answers as the model expects: running members answer and see a leader,
    /// paused, crashed and cut-off members do not answer.
    Members,
    /// Exactly one leader among reachable members; members serving ≥ quorum whenever the model
    /// says quorum holds, at the end of a step and at every instant during it.
    Quorum,
    /// Members agree on the KV hash at a common revision, and no member's store falls more than
    /// [`MAX_REVISION_LAG`] revisions behind the most advanced one.
    Consistency,
    /// A linearizable read through the endpoint succeeds within the deadline whenever the model
    /// says the service is up.
    Reachability,
    /// Every acknowledged write is readable with its value (after a restore: the writes before
    /// the backup; writes after the backup and before the restore are gone).
    Durability,
}

impl InvariantId {
    /// In checking order: structure first (who is in the cluster, who answers), so the first
    /// failure reported is the most direct one.
    pub const ALL: [InvariantId; 7] = [
        InvariantId::Membership,
        InvariantId::Leaks,
        InvariantId::Members,
        InvariantId::Quorum,
        InvariantId::Consistency,
        InvariantId::Reachability,
        InvariantId::Durability,
    ];

    pub fn name(self) -> &'static str {
        match self {
            InvariantId::Quorum => "quorum",
            InvariantId::Members => "members",
            InvariantId::Membership => "membership",
            InvariantId::Consistency => "consistency",
            InvariantId::Reachability => "reachability",
            InvariantId::Durability => "durability",
            InvariantId::Leaks => "leaks",
        }
    }

    /// Checks this invariant. [`Verdict::Fail`] may still go away as the stack converges;
    /// [`Verdict::Definite`] cannot.
    pub fn check(self, model: &Model, obs: &Observation) -> Verdict {
        match self {
            InvariantId::Quorum => quorum(model, obs),
            InvariantId::Members => members(model, obs),
            InvariantId::Membership => membership(model, obs),
            InvariantId::Consistency => consistency(obs),
            InvariantId::Reachability => reachability(model, obs),
            InvariantId::Durability => durability(model, obs),
            InvariantId::Leaks => leaks(model, obs),
        }
    }
}

impl fmt::Display for InvariantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for InvariantId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        shakedown_faults::parse_name(s, &InvariantId::ALL, InvariantId::name, "invariant")
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Broken now; may still converge.
    Fail(String),
    /// Broken for good: a sample taken during the step, or an acknowledged write missing from a
    /// successful linearizable read. Waiting cannot fix it.
    Definite(String),
}

impl Verdict {
    pub fn is_pass(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Pass => None,
            Verdict::Fail(m) | Verdict::Definite(m) => Some(m),
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub invariant: InvariantId,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.message)
    }
}

/// Checks `ids` in order; returns every failure.
pub fn check_all(ids: &[InvariantId], model: &Model, obs: &Observation) -> Vec<(InvariantId, Verdict)> {
    ids.iter().map(|&id| (id, id.check(model, obs))).filter(|(_, v)| !v.is_pass()).collect()
}

fn quorum(model: &Model, obs: &Observation) -> Verdict {
    // During the step: a majority of the membership kept serving at every instant, when the
    // model says quorum holds throughout the step. Windows shorter than MIN_LOSS_WINDOW_MS are
    // below the samplers' resolution (a member's answer and another's refusal a few ms apart).
    if obs.quorum_throughout {
        let lost = |s: &ServingSample| s.serving.len() < s.cluster_size / 2 + 1;
        let samples = &obs.serving_samples;
        let mut i = 0;
        while i < samples.len() {
            if !lost(&samples[i]) {
                i += 1;
                continue;
            }
            let start = &samples[i];
            let end = samples[i..].iter().find(|l| !lost(l));
            let end_ms = end.map_or(obs.samples_until_ms, |e| e.at_ms);
            let long_enough = end_ms.saturating_sub(start.at_ms) >= MIN_LOSS_WINDOW_MS;
            if long_enough {
                let until = end.map(|l| format!("until +{}ms", l.at_ms)).unwrap_or_else(|| format!("until at least +{end_ms}ms"));
                return Verdict::Definite(format!(
                    "quorum lost during the step: from +{}ms {until} only {} of {} members were serving ({})",
                    start.at_ms,
                    start.serving.len(),
                    start.cluster_size,
                    names(&start.serving),
                ));
            }
            i += samples[i..].iter().position(|l| !lost(l)).unwrap_or(samples.len() - i);
        }
    }
    let reachable: Vec<&MemberStatus> = obs.members.iter().filter(|m| m.reachable).collect();
    let leaders: BTreeSet<u64> = reachable.iter().filter_map(|m| m.leader).collect();
    if leaders.len() > 1 {
        let who: Vec<String> = reachable.iter().map(|m| format!("{} sees {:?}", m.name, m.leader.map(|l| format!("{l:x}")))).collect();
        return Verdict::Fail(format!("{} different leaders among reachable members: {}", leaders.len(), who.join(", ")));
    }
    if !model.quorum_expected() {
        return Verdict::Pass;
    }
    let Some(&leader) = leaders.iter().next() else {
        return Verdict::Fail(format!(
            "no leader, although {} of {} members are expected up (quorum {})",
            model.up(),
            model.size(),
            model.quorum()
        ));
    };
    let healthy: Vec<&str> = reachable
        .iter()
        .filter(|m| m.leader == Some(leader) && m.member.is_some_and(|id| model.members.contains_key(&id)))
        .map(|m| m.name.as_str())
        .collect();
    if healthy.len() < model.quorum() {
        return Verdict::Fail(format!(
            "only {} healthy voting members ({}) of {}; quorum is {}",
            healthy.len(),
            healthy.join(", "),
            model.size(),
            model.quorum()
        ));
    }
    Verdict::Pass
}

fn members(model: &Model, obs: &Observation) -> Verdict {
    let mut wrong = Vec::new();
    for m in model.members.values() {
        let seen = obs.members.iter().find(|s| s.member == Some(m.id));
        let answers = seen.is_some_and(|s| s.reachable);
        match model.answers(m) {
            Answers::Yes if !answers => {
                let why = seen.and_then(|s| s.error.clone()).unwrap_or_else(|| "not running".into());
                wrong.push(format!("{} is expected running but does not answer ({why})", m.id));
            }
            Answers::Yes if model.quorum_expected() && seen.is_some_and(|s| s.leader.is_none()) => {
                wrong.push(format!("{} is expected running but sees no leader", m.id));
            }
            Answers::No if answers => {
                let why = match model.outages.get(&m.site) {
                    Some(mode) => format!("its site {} is out ({mode})", m.site),
                    None => format!("it is {:?}", m.state).to_lowercase(),
                };
                wrong.push(format!("{} answers although {why}", m.id));
            }
            _ => {}
        }
    }
    if wrong.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(wrong.join("; "))
    }
}

fn names(ids: &[String]) -> String {
    if ids.is_empty() {
        "none".into()
    } else {
        ids.join(", ")
    }
}

fn membership(model: &Model, obs: &Observation) -> Verdict {
    let Some(list) = &obs.member_list else {
        if model.quorum_expected() {
            return Verdict::Fail("no member answered the member list request".into());
        }
        return Verdict::Pass;
    };
    let listed: BTreeMap<String, &ListedMember> = list.iter().map(|m| (m.name.clone(), m)).collect();
    let expected: BTreeSet<String> = model.members.keys().map(|id| id.to_string()).collect();
    // A member added but not started yet has an empty name; list it by peer URL.
    let stale: Vec<String> = listed
        .iter()
        .filter(|(name, _)| !expected.contains(*name))
        .map(|(name, m)| if name.is_empty() { format!("unstarted member {:x} ({})", m.id, m.peer_urls.join(",")) } else { format!("{name} ({:x})", m.id) })
        .collect();
    let missing: Vec<&String> = expected.iter().filter(|n| !listed.contains_key(*n)).collect();
    if stale.is_empty() && missing.is_empty() {
        return Verdict::Pass;
    }
    let mut parts = Vec::new();
    if !stale.is_empty() {
        parts.push(format!("stale member(s) not in the model: {}", stale.join(", ")));
    }
    if !missing.is_empty() {
        parts.push(format!("missing member(s): {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
    }
    Verdict::Fail(format!("member list differs from the model: {}", parts.join("; ")))
}

fn consistency(obs: &Observation) -> Verdict {
    let reachable = obs.members.iter().filter(|m| m.reachable && m.revision > 0);
    if let Some(newest) = reachable.clone().map(|m| m.revision).max() {
        let stalled: Vec<String> = reachable
            .filter(|m| newest - m.revision > MAX_REVISION_LAG)
            .map(|m| format!("{} at revision {} ({} behind)", m.name, m.revision, newest - m.revision))
            .collect();
        if !stalled.is_empty() {
            return Verdict::Fail(format!("store(s) trailing the newest revision {newest} by more than {MAX_REVISION_LAG}: {}", stalled.join(", ")));
        }
    }
    let mut by_rev: BTreeMap<i64, BTreeMap<u32, Vec<&str>>> = BTreeMap::new();
    for m in &obs.members {
        if let Some((rev, hash)) = m.hash {
            by_rev.entry(rev).or_default().entry(hash).or_default().push(&m.name);
        }
    }
    for (rev, hashes) in by_rev {
        if hashes.len() > 1 {
            let detail: Vec<String> = hashes.iter().map(|(h, who)| format!("{h:08x} on {}", who.join(","))).collect();
            return Verdict::Fail(format!("members disagree on the KV hash at revision {rev}: {}", detail.join("; ")));
        }
    }
    Verdict::Pass
}

fn reachability(model: &Model, obs: &Observation) -> Verdict {
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    if obs.probes.is_empty() {
        return Verdict::Fail("no probe ran".into());
    }
    let failed: Vec<&Probe> = obs.probes.iter().filter(|p| p.error.is_some()).collect();
    if failed.is_empty() {
        return Verdict::Pass;
    }
    let detail: Vec<String> = failed.iter().map(|p| format!("{} after {}ms", p.error.as_deref().unwrap_or_default(), p.latency_ms)).collect();
    Verdict::Fail(format!(
        "{} of {} linearizable reads through the endpoint failed although the model says the service is up: {}",
        failed.len(),
        obs.probes.len(),
        detail.join("; ")
    ))
}

/// What the current data must say about the write acknowledged at position `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Present,
    Absent,
    Either,
}

/// The expectation for the write at position `i`, following the chain of restores: after a
/// restore from backup B, writes before B's snapshot are what they were expected to be then,
/// writes during the snapshot or the restore may be either, writes between them are gone.
pub fn expect_write(i: usize, marks: &Marks) -> Expect {
    fn at(i: usize, marks: &Marks, restores: usize) -> Expect {
        let Some(&(backup, r_start, r_end)) = marks.restores[..restores].last() else { return Expect::Present };
        if i >= r_end {
            return Expect::Present;
        }
        if i >= r_start {
            return Expect::Either;
        }
        let Some(&(b_start, b_end)) = marks.backups.get(&backup) else { return Expect::Either };
        if i >= b_end {
            return Expect::Absent;
        }
        if i >= b_start {
            return Expect::Either;
        }
        // Before the backup: as expected when the backup was taken, i.e. after the restores that
        // came before this one and had finished by then (strictly earlier: the recursion ends).
        let earlier = marks.restores[..restores - 1].iter().take_while(|(_, _, end)| *end <= b_start).count();
        at(i, marks, earlier)
    }
    at(i, marks, marks.restores.len())
}

fn durability(model: &Model, obs: &Observation) -> Verdict {
    // Without quorum nothing can be read back; the writes are checked once quorum is back.
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    let Some(d) = &obs.durability else {
        return Verdict::Pass;
    };
    if let Some(err) = &d.read_error {
        return Verdict::Fail(format!("could not read back the acknowledged writes: {err}"));
    }
    let mut lost = Vec::new();
    let mut wrong = Vec::new();
    let mut resurrected = Vec::new();
    for (i, (key, value)) in d.acked.iter().enumerate() {
        match (expect_write(i, &d.marks), d.read.get(key)) {
            (Expect::Present, None) => lost.push(key.as_str()),
            (Expect::Present | Expect::Either, Some(v)) if v != value => wrong.push(key.as_str()),
            (Expect::Absent, Some(_)) => resurrected.push(key.as_str()),
            _ => {}
        }
    }
    if lost.is_empty() && wrong.is_empty() && resurrected.is_empty() {
        return Verdict::Pass;
    }
    let sample = |v: &[&str]| {
        let head = v.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        if v.len() > 3 {
            format!("{head}, …")
        } else {
            head
        }
    };
    let mut parts = Vec::new();
    if !lost.is_empty() {
        let first = d.acked.iter().position(|(k, _)| k == lost[0]).unwrap_or(0);
        parts.push(format!("{} of {} acknowledged writes lost ({}; the first is ack #{first}{})", lost.len(), d.acked.len(), sample(&lost), context(&d.marks)));
    }
    if !wrong.is_empty() {
        parts.push(format!("{} read back with a different value ({})", wrong.len(), sample(&wrong)));
    }
    if !resurrected.is_empty() {
        parts.push(format!("{} written after the restored backup are still there ({}): the restore did not restore", resurrected.len(), sample(&resurrected)));
    }
    Verdict::Definite(parts.join("; "))
}

/// The backup and restore positions, for messages.
fn context(marks: &Marks) -> String {
    let mut parts: Vec<String> = marks.backups.iter().map(|(b, (s, e))| format!("{b} taken during acks #{s}..#{e}")).collect();
    parts.extend(marks.restores.iter().map(|(b, s, e)| match *e {
        usize::MAX => format!("{b} restore begun at ack #{s} and not finished"),
        e => format!("{b} restored during acks #{s}..#{e}"),
    }));
    if parts.is_empty() {
        String::new()
    } else {
        format!("; {}", parts.join(", "))
    }
}

fn leaks(model: &Model, obs: &Observation) -> Verdict {
    let Some(inv) = &obs.inventory else {
        return Verdict::Pass;
    };
    if let Some(kube) = &inv.kube {
        return kube_leaks(model, kube);
    }
    let mut problems = Vec::new();
    let mut compare = |what: &str, found: &std::collections::BTreeSet<String>, must: Vec<String>, may: Vec<String>| {
        let leaked: Vec<&String> = found.iter().filter(|f| !must.contains(f) && !may.contains(f)).collect();
        let missing: Vec<&String> = must.iter().filter(|m| !found.contains(*m)).collect();
        if !leaked.is_empty() {
            problems.push(format!("{what} left behind: {}", leaked.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
        }
        if !missing.is_empty() {
            problems.push(format!("{what} missing: {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
        }
    };
    let names = |f: &dyn Fn(&shakedown_faults::Member) -> bool| model.members.values().filter(|m| f(m)).map(|m| m.id.to_string()).collect::<Vec<_>>();
    // A member whose process is missing is the `members` invariant's finding, not a leak.
    compare("etcd processes", &inv.processes, vec![], names(&|m| model.has_process(m) != Answers::No));
    let all = names(&|_| true);
    let disks = if inv.loop_disks { all.clone() } else { vec![] };
    compare("mounts", &inv.mounts, disks.clone(), vec![]);
    compare("loop devices", &inv.loop_devices, disks, vec![]);
    compare("data directories", &inv.data_dirs, all, vec![]);
    let isolated: Vec<String> = model.outages.iter().filter(|(_, m)| **m == OutageMode::Isolate).map(|(s, _)| s.to_string()).collect();
    compare("partition rules", &inv.partition_rules, isolated, vec![]);
    compare("backup files", &inv.backups, model.backups.iter().map(BackupId::to_string).collect(), vec![]);
    if inv.haproxies == 0 {
        problems.push("no HAProxy process".into());
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(problems.join("; "))
    }
}

/// The kube target's leaks: Machines that stand for no model member, members expected to have
/// a Machine without one, worker Machines against their MachineDeployment's replicas, orphaned
/// InfraMachines, Nodes, volumes and attachments, objects stuck in deletion.
fn kube_leaks(model: &Model, inv: &KubeInventory) -> Verdict {
    let mut problems = Vec::new();
    let stray: Vec<&str> = inv.machines.iter().filter(|(_, m)| m.is_none()).map(|(n, _)| n.as_str()).collect();
    if !stray.is_empty() {
        problems.push(format!("control-plane Machine(s) standing for no member of the model left behind: {}", stray.join(", ")));
    }
    let bound: BTreeSet<MemberId> = inv.machines.values().flatten().copied().collect();
    let missing: Vec<String> = model.members.values().filter(|m| model.has_process(m) == Answers::Yes && !bound.contains(&m.id)).map(|m| m.id.to_string()).collect();
    if !missing.is_empty() {
        problems.push(format!("no Machine for member(s) {}", missing.join(", ")));
    }
    for (md, want, found) in &inv.machine_deployments {
        if *found as i64 != *want {
            problems.push(format!("MachineDeployment {md} has {found} Machine(s), spec.replicas is {want}"));
        }
    }
    for (what, list) in [
        ("InfraMachine(s) without a Machine", &inv.orphan_infra_machines),
        ("Node(s) without a Machine", &inv.orphan_nodes),
        ("PersistentVolume(s) Released or Failed", &inv.released_volumes),
        ("VolumeAttachment(s) whose Node is gone", &inv.orphan_volume_attachments),
    ] {
        if !list.is_empty() {
            problems.push(format!("{what}: {}", list.join(", ")));
        }
    }
    let stuck: Vec<String> = inv.deleting.iter().filter(|(_, s)| **s >= STUCK_DELETION_SECS).map(|(o, s)| format!("{o} ({s}s)")).collect();
    if !stuck.is_empty() {
        problems.push(format!("object(s) stuck in deletion for more than {STUCK_DELETION_SECS}s: {}", stuck.join(", ")));
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(problems.join("; "))
    }
}

/// Members of the model the observation says are not serving: for progress lines and forensics.
pub fn unreachable_members(model: &Model, obs: &Observation) -> Vec<MemberId> {
    model
        .members
        .keys()
        .filter(|id| !obs.members.iter().any(|m| m.member == Some(**id) && m.reachable))
        .copied()
        .collect()
}
