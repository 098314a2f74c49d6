//! Targets: the stacks under test. One trait, backends as siblings (`local`, `kube`).

pub mod kube;
pub mod local;

use std::collections::BTreeMap;

use shakedown_faults::{Model, Op};
use shakedown_invariants::{InvariantId, Observation};

/// Why a target could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TargetError {
    /// The machine cannot do it: a command failed, a binary is missing, no permission.
    #[error("{0}")]
    Environment(String),
    /// The stack did not do what the op waits for within its bound (a member never became
    /// healthy, a reconfiguration was refused): a finding about the stack.
    #[error("{0}")]
    Stack(String),
    /// The target does not support the op here (with the reason).
    #[error("{0}")]
    Unsupported(String),
}

/// A stack under test.
///
/// Architecture invariant: a target never decides whether an invariant holds; it executes ops
/// and reports observations, and `shakedown-invariants` judges them against the model.
#[allow(async_fn_in_trait)]
pub trait Target {
    fn name(&self) -> &'static str;

    /// Component name → version, for seed records.
    fn component_versions(&self) -> BTreeMap<String, String>;

    /// `Err(reason)` when this target cannot execute `op` here (the engine skips it, says why,
    /// and runs the rest of the plan).
    fn supports(&self, op: &Op) -> Result<(), String>;

    /// Executes `op`, which takes the stack from `before` to `after` in the model. A target may
    /// start sampling the stack here; samples go into every observation until [`Target::end_step`].
    async fn execute(&mut self, op: &Op, before: &Model, after: &Model) -> Result<(), TargetError>;

    /// The step's checks are done: stop what `execute` started for the step.
    async fn end_step(&mut self);

    /// Observes what the listed invariants need, including the samples of the current step.
    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation;

    /// Component logs (name, path) whose last lines go into the forensics of a failed run.
    fn log_files(&self) -> Vec<(String, std::path::PathBuf)>;

    /// One-line workload statistics for progress output and the event log.
    fn workload_stats(&self) -> serde_json::Value;

    /// Events the target recorded since the last call (hook output, request counts), for the
    /// run's event log.
    fn take_events(&mut self) -> Vec<(String, serde_json::Value)> {
        Vec::new()
    }

    /// `Some(why)` when the target lost the stack's control API during the run (the kube
    /// target's management cluster): what the checks read cannot be trusted, the run ends with
    /// exit 4 whatever its outcome.
    fn lost(&self) -> Option<String> {
        None
    }

    /// Tears everything down. Idempotent.
    async fn teardown(&mut self);
}
