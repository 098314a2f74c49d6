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
use crate::profile::Profile;

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
    pub ops: Vec<Op>,
}

impl Plan {
    /// Replays the preconditions from `model`; returns the model after the last op,
    /// or the index of the first op whose precondition fails.
    pub fn validate(&self, mut model: Model) -> Result<Model, (usize, PreconditionError)> {
        for (i, op) in self.ops.iter().enumerate() {
            model.apply(op).map_err(|e| (i, e))?;
        }
        Ok(model)
    }
}

/// The deterministic RNG for `seed`: ChaCha keyed by the seed's little-endian bytes.
pub fn rng_for(seed: u64) -> TestRng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(b"shakedwn");
    TestRng::from_seed(RngAlgorithm::ChaCha, &key)
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

/// The plan for (seed, profile).
pub fn generate(seed: u64, profile: &Profile) -> Plan {
    generate_from(seed, profile, profile.initial_model(), profile.steps)
}

/// A plan of `steps` ops starting from `model`.
pub fn generate_from(seed: u64, profile: &Profile, mut model: Model, steps: usize) -> Plan {
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
    Plan { seed, profile: profile.name.clone(), weights, ops }
}
