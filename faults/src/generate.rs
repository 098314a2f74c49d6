//! Plan generation: a reference state machine driven by proptest strategies over a ChaCha RNG
//! seeded from one u64. The next op is drawn from the ops whose precondition holds in the
//! current model, weighted by kind. Same (seed, profile) → same plan, on any machine.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::{Union, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::op::{Op, OpKind, PreconditionError};
use crate::profile::{
    election_choices, EtcdFlag, EtcdFlags, Profile, DRAWN_COMPACTION_BATCH_LIMITS, DRAWN_SNAPSHOT_COUNTS, ETCD_DEFAULT_HEARTBEAT,
};

/// Op weights by kind; 0 disables a kind.
pub type Weights = BTreeMap<OpKind, u32>;

/// The largest weight drawn for a kind the profile does not pin.
pub const MAX_DRAWN_WEIGHT: u32 = 10;

/// The largest weight drawn for `disk-replace` when the profile does not pin it: it competes
/// with `disk-reattach` for the same detached disks and is the rarer recovery (the operator's,
/// by hand), so a swarm plan mostly reattaches.
pub const MAX_DRAWN_REPLACE_WEIGHT: u32 = 3;

/// The largest weight drawn for `defrag` when the profile does not pin it: every running member
/// is a candidate at every step and nothing in the model changes, so at the full weight a swarm
/// plan spent nearly half its steps defragmenting (330 of 704 in a 14-minute nightly soak) instead
/// of faulting.
pub const MAX_DRAWN_DEFRAG_WEIGHT: u32 = 3;

/// The largest weight drawn for `partition-until-snapshot` when the profile does not pin it: each
/// one holds its cut while the others apply thousands of entries (seconds of filler writes), so
/// a swarm plan holds a few of them, not dozens.
pub const MAX_DRAWN_SNAPSHOT_PARTITION_WEIGHT: u32 = 3;

/// The largest weight drawn for `kind` when the profile does not pin it.
pub fn max_drawn_weight(kind: OpKind) -> u32 {
    match kind {
        OpKind::DiskReplace => MAX_DRAWN_REPLACE_WEIGHT,
        OpKind::Defrag => MAX_DRAWN_DEFRAG_WEIGHT,
        OpKind::PartitionUntilSnapshot => MAX_DRAWN_SNAPSHOT_PARTITION_WEIGHT,
        _ => MAX_DRAWN_WEIGHT,
    }
}

/// An explicit op sequence and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    #[serde(with = "crate::seed")]
    pub seed: u64,
    pub profile: String,
    /// The weights used, pinned by the profile or drawn from the seed (swarm testing).
    pub weights: Weights,
    /// etcd's flags the plan runs with, pinned and drawn together, when the profile draws any
    /// (`[etcd] draw`): replay and shrink run with these, never a fresh draw. Absent when it
    /// draws none: the profile's `[etcd]` are then the plan's, so the plans and records of such
    /// profiles (and every record written before flags could be drawn) read as they always did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdFlags>,
    pub ops: Vec<Op>,
}

impl Plan {
    /// etcd's flags this plan runs with under `profile`: its own, else the profile's (nothing
    /// left to draw: a plan made by hand for a profile that draws gets the seed's draw).
    pub fn etcd_flags(&self, profile: &Profile) -> EtcdFlags {
        self.etcd.clone().or_else(|| draw_etcd_flags(self.seed, profile)).unwrap_or_else(|| profile.etcd.clone())
    }

    /// The profile this plan runs with: `profile` with [`Plan::etcd_flags`] as its `[etcd]`
    /// (pinned, nothing to draw). The model starts from it and the target starts etcd with it;
    /// records and the run directory keep `profile` itself.
    pub fn run_profile(&self, profile: &Profile) -> Profile {
        Profile { etcd: self.etcd_flags(profile), ..profile.clone() }
    }

    /// What is wrong with the etcd flags this plan carries for `profile` (an edited record): flags
    /// for a profile that draws none, none for one that draws, a flag the profile pins with
    /// another value, a flag it draws without a value, or a value etcd refuses.
    pub fn etcd_problem(&self, profile: &Profile) -> Option<String> {
        let drawn = &profile.etcd.draw;
        let Some(flags) = &self.etcd else {
            return (!drawn.is_empty())
                .then(|| format!("the plan has no [plan.etcd] flags, but profile {} draws {}", profile.name, names(drawn)));
        };
        if drawn.is_empty() {
            return Some(format!("the plan has [plan.etcd] flags, but profile {} draws none (its [etcd] are the plan's)", profile.name));
        }
        if !flags.draw.is_empty() {
            return Some("the plan's [plan.etcd] flags draw nothing: they are the values drawn".into());
        }
        let pinned = EtcdFlags { draw: vec![], ..profile.etcd.clone() };
        let mut expected = flags.clone();
        for flag in drawn {
            let missing = match flag {
                EtcdFlag::SnapshotCount => expected.snapshot_count.take().is_none(),
                EtcdFlag::Heartbeat => expected.heartbeat.take().is_none(),
                EtcdFlag::Election => expected.election.take().is_none(),
                EtcdFlag::CompactionBatchLimit => expected.compaction_batch_limit.take().is_none(),
            };
            if missing {
                return Some(format!("the plan's [plan.etcd] flags have no {flag}, which profile {} draws", profile.name));
            }
        }
        if expected != pinned {
            return Some(format!(
                "the plan's [plan.etcd] flags ({}) do not keep what profile {} pins ({})",
                flags.summary(),
                profile.name,
                pinned.summary()
            ));
        }
        flags.problem().map(|p| format!("the plan's [plan.etcd] flags: {p}"))
    }

    /// Replays the preconditions from `model`; returns the model after the last op,
    /// or the index of the first op whose precondition fails.
    pub fn validate(&self, mut model: Model) -> Result<Model, (usize, PreconditionError)> {
        for (i, op) in self.ops.iter().enumerate() {
            model.apply(op).map_err(|e| (i, e))?;
        }
        Ok(model)
    }
}

fn names(flags: &[EtcdFlag]) -> String {
    flags.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
}

/// The deterministic RNG for `seed`: ChaCha keyed by the seed's little-endian bytes.
pub fn rng_for(seed: u64) -> TestRng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(b"shakedwn");
    TestRng::from_seed(RngAlgorithm::ChaCha, &key)
}

/// The deterministic RNG of `seed` for drawing etcd flag `flag`: ChaCha keyed by the seed and the
/// flag, a stream of its own, apart from [`rng_for`]'s.
fn etcd_rng_for(seed: u64, flag: EtcdFlag) -> TestRng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(b"etcdflag");
    key[16] = EtcdFlag::ALL.iter().position(|f| *f == flag).expect("every flag is in ALL") as u8;
    TestRng::from_seed(RngAlgorithm::ChaCha, &key)
}

/// etcd's flags for a plan of `seed`: the profile's pinned ones with those it draws (`[etcd]
/// draw`) drawn; `None` when it draws none.
///
/// They are drawn first, before the weights and ops, because the model a plan starts from
/// depends on them (the failpoints a run can reach depend on `snapshot_count`). Each flag is
/// drawn from a stream of the seed of its own ([`etcd_rng_for`]), never from the stream the
/// weights and ops come from: a profile that draws nothing plans exactly as before flags could
/// be drawn (the seed-1 snapshot of the default profile is unchanged), a profile that starts
/// drawing keeps each seed's weights (and its ops, unless the model itself changes), and drawing
/// one more flag changes no other flag's value. Each value comes from the documented set of its
/// [`EtcdFlag`]; an election timeout from those that fit the heartbeat (drawn just before it, or
/// pinned, else etcd's).
pub fn draw_etcd_flags(seed: u64, profile: &Profile) -> Option<EtcdFlags> {
    let pinned = &profile.etcd;
    if pinned.draw.is_empty() {
        return None;
    }
    fn pick<T: Copy>(seed: u64, flag: EtcdFlag, choices: &[T]) -> T {
        assert!(!choices.is_empty(), "etcd.draw names {flag} with nothing to draw from: Profile::validate refuses that");
        let mut runner = TestRunner::new_with_rng(Config::default(), etcd_rng_for(seed, flag));
        choices[draw(&mut runner, &(0..choices.len()))]
    }
    let mut flags = EtcdFlags { draw: vec![], ..pinned.clone() };
    for flag in EtcdFlag::ALL.into_iter().filter(|f| pinned.draws(*f)) {
        match flag {
            EtcdFlag::SnapshotCount => flags.snapshot_count = Some(pick(seed, flag, &DRAWN_SNAPSHOT_COUNTS)),
            EtcdFlag::Heartbeat => flags.heartbeat = Some(pick(seed, flag, &pinned.heartbeat_choices())),
            EtcdFlag::Election => {
                flags.election = Some(pick(seed, flag, &election_choices(flags.heartbeat.unwrap_or(ETCD_DEFAULT_HEARTBEAT))))
            }
            EtcdFlag::CompactionBatchLimit => flags.compaction_batch_limit = Some(pick(seed, flag, &DRAWN_COMPACTION_BATCH_LIMITS)),
        }
    }
    Some(flags)
}

fn draw<S: Strategy>(runner: &mut TestRunner, strategy: &S) -> S::Value {
    strategy.new_tree(runner).expect("strategies used here never reject").current()
}

/// The weights for a plan: pinned ones from the profile, the rest drawn from the seed.
/// If every weight ends up 0 (the drawn ones all drew 0), every kind the profile did not pin
/// to 0 gets weight 1: a pinned 0 disables its kind whatever the draw.
pub fn draw_weights(runner: &mut TestRunner, profile: &Profile) -> Weights {
    // Only the kinds the profile's stack can have get a weight (an etcd tier's plans and records
    // never mention the application ops, and the other way round; nor `failpoint` without a
    // failpoint build).
    let mut weights: Weights = OpKind::ALL
        .into_iter()
        .filter(|kind| profile.has_kind(*kind))
        .map(|kind| {
            let w = match profile.weights.get(&kind) {
                _ if !profile.allows(kind) => 0,
                Some(&w) => w,
                None => draw(runner, &(0..=max_drawn_weight(kind))),
            };
            (kind, w)
        })
        .collect();
    if weights.values().all(|&w| w == 0) {
        weights.iter_mut().filter(|(k, _)| profile.allows(**k) && profile.weights.get(*k) != Some(&0)).for_each(|(_, w)| *w = 1);
    }
    weights
}

/// A strategy for the next op from `model`: a weighted union over the kinds that have a valid
/// op, each arm choosing uniformly among that kind's valid ops. If no kind with a positive
/// weight has a valid op, every valid kind the profile did not switch off (weight pinned to 0)
/// gets weight 1, so swarm weights never get a plan stuck. `None` when no op is possible: the
/// plan then ends early.
pub fn next_op_strategy(model: &Model, weights: &Weights, switched_off: &[OpKind]) -> Option<BoxedStrategy<Op>> {
    let mut arms = Vec::new();
    let mut fallback = Vec::new();
    for kind in OpKind::ALL {
        let candidates = model.candidates(kind);
        if candidates.is_empty() {
            continue;
        }
        let w = weights.get(&kind).copied().unwrap_or(0);
        if w > 0 {
            arms.push((w, proptest::sample::select(candidates.clone()).boxed()));
        }
        if !switched_off.contains(&kind) {
            fallback.push((1, proptest::sample::select(candidates).boxed()));
        }
    }
    let arms = if arms.is_empty() { fallback } else { arms };
    if arms.is_empty() {
        return None;
    }
    Some(Union::new_weighted(arms).boxed())
}

/// The plan for (seed, profile): etcd's flags drawn first ([`draw_etcd_flags`]), then, from the
/// model of a stack started with them, the weights and the ops.
pub fn generate(seed: u64, profile: &Profile) -> Plan {
    let etcd = draw_etcd_flags(seed, profile);
    let model = match &etcd {
        Some(flags) => Profile { etcd: flags.clone(), ..profile.clone() }.initial_model(),
        None => profile.initial_model(),
    };
    generate_from(seed, profile, model, profile.steps)
}

/// A plan of `steps` ops starting from `model` (etcd's flags drawn as [`generate`] draws them;
/// `model` is the caller's).
pub fn generate_from(seed: u64, profile: &Profile, mut model: Model, steps: usize) -> Plan {
    let etcd = draw_etcd_flags(seed, profile);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng_for(seed));
    let weights = draw_weights(&mut runner, profile);
    let switched_off: Vec<OpKind> = OpKind::ALL.into_iter().filter(|k| !profile.allows(*k) || profile.weights.get(k) == Some(&0)).collect();
    let mut ops = Vec::with_capacity(steps);
    for _ in 0..steps {
        let Some(strategy) = next_op_strategy(&model, &weights, &switched_off) else { break };
        let op = draw(&mut runner, &strategy);
        model.apply(&op).expect("generated ops satisfy their precondition");
        ops.push(op);
    }
    Plan { seed, profile: profile.name.clone(), weights, etcd, ops }
}
