//! Targets: the stacks under test. One trait ([`Target`]), backends as siblings (`local`,
//! `kube`), and one registration: [`TargetSpec`] (what a seed record says about the stack),
//! [`TargetOptions`] (what this machine says: binaries, kubeconfig) and [`start`].
//!
//! A new target is a folder beside `local/` and `kube/` holding its spec, its options and its
//! `Target` implementation, plus an entry in each enum and match of this file.

/// How many lines of each log (a component's, a pod's) the forensics of a failed run keep.
pub const FORENSIC_LOG_LINES: usize = 200;

pub mod api;
pub mod app;
pub mod kube;
pub mod local;
pub mod reap;
pub mod recorder;
pub(crate) mod requests;
pub mod samples;
pub mod sim;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shakedown_faults::{Model, Op, Profile};
use shakedown_invariants::{InvariantId, Observation};

use crate::exit::Fatal;

/// Something a target did that the run's event log keeps (a hook's output, the pods a kill took):
/// `kind` names it (`hook`, `app-kill`, `local-note`, …), `detail` is its JSON. The engine and the
/// session write each as a `target` event; a target knows nothing of the event log.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub kind: String,
    pub detail: serde_json::Value,
}

impl Note {
    pub fn new(kind: &str, detail: serde_json::Value) -> Note {
        Note { kind: kind.to_string(), detail }
    }
}

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

/// A command that did not run to its end is the machine's failure (as when it exits non-zero).
impl From<crate::command::CommandError> for TargetError {
    fn from(e: crate::command::CommandError) -> TargetError {
        TargetError::Environment(e.to_string())
    }
}

/// Why a target cannot execute an op here: a sentence for the user (what is missing, and how to
/// provide it). The engine skips the op and says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

impl From<String> for Unsupported {
    fn from(reason: String) -> Unsupported {
        Unsupported(reason)
    }
}

impl From<&str> for Unsupported {
    fn from(reason: &str) -> Unsupported {
        Unsupported(reason.to_string())
    }
}

impl From<crate::pki::PkiError> for TargetError {
    fn from(e: crate::pki::PkiError) -> TargetError {
        TargetError::Environment(e.0)
    }
}

/// The kinds of target, as `--target` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetKind {
    /// The built-in real testbed on this machine (etcd members, HAProxy, loop disks).
    Local,
    /// A Cluster API Cluster on a management cluster (--cluster NS/NAME, kubeconfig).
    Kube,
    /// An application on a Kubernetes cluster (--app-profile FILE, kubeconfig).
    App,
    /// shakedown's own tests: the model's expected stack in memory (--sim-bug to misbehave).
    Sim,
}

/// What a seed record says about the stack its plan ran on: enough to run the same plan on the
/// same kind of stack again. Serialized as the record's `[target]` table, tagged by `kind`.
#[allow(clippy::large_enum_variant, reason = "one value per run or per line of the event log: boxing saves nothing that matters")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TargetSpec {
    Local(local::LocalSpec),
    Kube(kube::KubeSpec),
    App(app::spec::AppSpec),
    Sim(sim::SimSpec),
}

/// What this machine and this command line add to a spec (binaries, disks, kubeconfig, dry
/// run): never recorded, given again on replay.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetOptions {
    #[command(flatten)]
    pub local: local::LocalOptions,
    #[command(flatten)]
    pub kube: kube::KubeOptions,
    #[command(flatten)]
    pub app: app::spec::AppOptions,
    #[command(flatten)]
    pub sim: sim::SimOptions,
}

/// The usage error for options of one target given to another (`given`: the flags used).
pub fn refuse_options(given: &[&str], owner: &str, target: &str) -> Result<(), Fatal> {
    match given.len() {
        0 => Ok(()),
        1 => Err(Fatal::usage(format!("{} is for the {owner} target; --target {target} does not take it", given[0]))),
        _ => Err(Fatal::usage(format!("{} are for the {owner} target; --target {target} does not take them", given.join(", ")))),
    }
}

/// Whether a profile's `stack` runs on a target of `kind`: the app stack only on `--target app`,
/// the others nowhere else (`sim` runs any). Checked before anything is created, and by
/// `validate`.
pub fn stack_fits(kind: TargetKind, profile: &Profile) -> Result<(), Fatal> {
    use shakedown_faults::Stack;
    match (kind, profile.stack) {
        (TargetKind::Local, Stack::App) => Err(Fatal::usage(format!(
            "profile {} has stack = \"app\": it runs on --target app (an application on a Kubernetes cluster), not the local stack",
            profile.name
        ))),
        (TargetKind::Kube, Stack::App) => Err(Fatal::usage(format!(
            "profile {} has stack = \"app\": it runs on --target app, not on a Cluster API Cluster",
            profile.name
        ))),
        (TargetKind::App, stack) if stack != Stack::App => Err(Fatal::usage(format!(
            "--target app runs profiles with stack = \"app\" (the application ops); profile {} has stack = \"{}\"",
            profile.name,
            stack.name()
        ))),
        _ => Ok(()),
    }
}

/// Where and for what a target is started.
pub struct StartContext<'a> {
    pub run_id: &'a str,
    pub run_dir: &'a Path,
    pub profile: &'a Profile,
    pub model: &'a Model,
    pub options: &'a TargetOptions,
}

/// What a started target says about itself: the progress line after bring-up, and notes (what
/// it could not find, what it will not check) that the run prints and records.
#[derive(Debug, Clone, Default)]
pub struct Started {
    pub line: String,
    pub fields: serde_json::Value,
    pub notes: Vec<String>,
}

impl TargetSpec {
    /// `profile` as this target runs it. The application target draws only the op kinds its
    /// app profile can run (a profile without an operator Deployment draws no
    /// `operator-restart`): each kind left out is said once, with why; a profile none of whose
    /// kinds can run is refused (exit 2). Plans are drawn from what this returns, and the
    /// record keeps it, so a replay draws the same plan. Other targets run `profile` as it is.
    pub fn fit(&self, mut profile: Profile) -> Result<Profile, Fatal> {
        let TargetSpec::App(app) = self else { return Ok(profile) };
        if profile.stack != shakedown_faults::Stack::App {
            // Refused by the pre-flight, which says why.
            return Ok(profile);
        }
        let allowed: Vec<shakedown_faults::OpKind> = shakedown_faults::OpKind::ALL.into_iter().filter(|k| profile.allows(*k)).collect();
        let (can, cannot): (Vec<_>, Vec<_>) = allowed.into_iter().partition(|k| app.app_profile.supports(*k).is_ok());
        if cannot.is_empty() {
            return Ok(profile);
        }
        let why: Vec<String> = cannot.iter().filter_map(|k| app.app_profile.supports(*k).err().map(|why| format!("{k} ({why})"))).collect();
        if can.is_empty() {
            return Err(Fatal::usage(format!(
                "none of the op kinds profile {} draws can run against this app profile: {}",
                profile.name,
                why.join("; ")
            )));
        }
        tracing::warn!("profile {}: not drawn, the app profile cannot run them: {}", profile.name, why.join("; "));
        profile.weights.retain(|k, _| can.contains(k));
        profile.ops = Some(can);
        profile.validate().map_err(|e| Fatal::internal(format!("profile {} narrowed to the app profile's ops: {e}", profile.name)))?;
        Ok(profile)
    }

    pub fn kind(&self) -> TargetKind {
        match self {
            TargetSpec::Local(_) => TargetKind::Local,
            TargetSpec::Kube(_) => TargetKind::Kube,
            TargetSpec::App(_) => TargetKind::App,
            TargetSpec::Sim(_) => TargetKind::Sim,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.kind() {
            TargetKind::Local => "local",
            TargetKind::Kube => "kube",
            TargetKind::App => "app",
            TargetKind::Sim => "sim",
        }
    }

    /// The spec of a new run on `kind` from the command line; with `recorded` (a replay, a
    /// shrink), the recorded spec with what the command line overrides. Options that belong to
    /// another target are refused, never ignored.
    pub fn from_options(kind: TargetKind, options: &TargetOptions, recorded: Option<&TargetSpec>) -> Result<TargetSpec, Fatal> {
        match kind {
            TargetKind::Local => {
                options.kube.refuse_for("local")?;
                options.app.refuse_for("local")?;
                options.sim.refuse_for("local")?;
                let recorded = match recorded {
                    Some(TargetSpec::Local(s)) => Some(s),
                    _ => None,
                };
                Ok(TargetSpec::Local(local::LocalSpec::from_options(&options.local, recorded)))
            }
            TargetKind::Kube => {
                options.local.refuse_for("kube")?;
                options.app.refuse_for("kube")?;
                options.sim.refuse_for("kube")?;
                let recorded = match recorded {
                    Some(TargetSpec::Kube(s)) => Some(s),
                    _ => None,
                };
                Ok(TargetSpec::Kube(kube::KubeSpec::from_options(&options.kube, recorded)?))
            }
            TargetKind::App => {
                options.local.refuse_for("app")?;
                options.kube.refuse_for_app()?;
                options.sim.refuse_for("app")?;
                let recorded = match recorded {
                    Some(TargetSpec::App(s)) => Some(s),
                    _ => None,
                };
                Ok(TargetSpec::App(app::spec::AppSpec::from_options(&options.app, options.kube.context.as_deref(), recorded)?))
            }
            TargetKind::Sim => {
                options.local.refuse_for("sim")?;
                options.kube.refuse_for("sim")?;
                options.app.refuse_for("sim")?;
                let recorded = match recorded {
                    Some(TargetSpec::Sim(s)) => Some(s),
                    _ => None,
                };
                Ok(TargetSpec::Sim(sim::SimSpec::from_options(&options.sim, recorded)))
            }
        }
    }

    /// A short description for progress lines: `local`, `local · planted bug X`, `Cluster ns/c`.
    pub fn describe(&self) -> String {
        match self {
            TargetSpec::Local(s) => s.describe(),
            TargetSpec::Kube(s) => s.describe(),
            TargetSpec::App(s) => s.describe(),
            TargetSpec::Sim(s) => s.describe(),
        }
    }

    /// The JUnit classname part for runs of this spec.
    pub fn junit_class(&self) -> String {
        match self {
            TargetSpec::Local(s) if s.testbed_bug.is_some() => "planted".into(),
            other => other.name().into(),
        }
    }

    /// What the replay command of a record of this spec needs besides the file (the options
    /// that are not recorded, such as the kubeconfig).
    pub fn replay_flags(&self, options: &TargetOptions) -> String {
        match self {
            TargetSpec::Local(_) | TargetSpec::Sim(_) => String::new(),
            TargetSpec::Kube(_) | TargetSpec::App(_) => {
                options.kube.kubeconfig.as_ref().map(|k| format!(" --kubeconfig {}", k.display())).unwrap_or_default()
            }
        }
    }
}

/// A spec whose machine-side needs were checked by [`prepare`], with what the check found.
#[allow(clippy::large_enum_variant, reason = "one value per run or per line of the event log: boxing saves nothing that matters")]
pub enum Prepared {
    /// The local target's binaries and disk mode.
    Local(local::LocalSpec, local::Environment),
    Kube(kube::KubeSpec),
    App(app::spec::AppSpec),
    Sim(sim::SimSpec),
}

/// Checks, before anything is created, that this machine can start the target (the local
/// target's binaries and disks): a run that cannot start leaves no run directory behind.
pub fn prepare(spec: &TargetSpec, options: &TargetOptions, profile: &Profile) -> Result<Prepared, Fatal> {
    stack_fits(spec.kind(), profile)?;
    Ok(match spec {
        TargetSpec::Local(s) => Prepared::Local(s.clone(), options.local.environment(profile)?),
        TargetSpec::Kube(s) => Prepared::Kube(s.clone()),
        TargetSpec::App(s) => Prepared::App(s.clone()),
        TargetSpec::Sim(s) => Prepared::Sim(s.clone()),
    })
}

/// Starts the target a prepared spec names (brings the local stack up, connects to the
/// management cluster). The one place that knows every target.
pub async fn start(prepared: Prepared, ctx: &StartContext<'_>) -> Result<Box<dyn Target>, Fatal> {
    Ok(match prepared {
        Prepared::Local(s, env) => Box::new(local::LocalTarget::start_spec(&s, env, ctx).await?),
        Prepared::Kube(s) => Box::new(kube::KubeTarget::start_spec(&s, ctx).await?),
        Prepared::App(s) => Box::new(app::AppTarget::start_spec(&s, ctx).await?),
        Prepared::Sim(s) => Box::new(sim::SimTarget::start_spec(&s, ctx)?),
    })
}

/// Whether a target checks an invariant in this run: every target decides for every invariant,
/// with no default ([`Target::coverage`] matches [`InvariantId`] exhaustively), so a new
/// invariant stops the build at each target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Observed for every check. An observation that then holds nothing for it is a bug in
    /// shakedown (the engine ends the run with exit 5), never a pass.
    Checked,
    /// Cannot be observed here (the reason): left out of the run and listed as not checked in its
    /// summary, event log, report and JUnit.
    Unchecked(String),
}

/// The invariants `target` checks here (its coverage says `Checked`), in checking order: what a
/// caller that drives a target itself (a test, a benchmark) judges.
pub fn checked(target: &dyn Target) -> Vec<InvariantId> {
    InvariantId::ALL.into_iter().filter(|&id| target.coverage(id) == Coverage::Checked).collect()
}

/// A stack under test.
///
/// Architecture invariant: a target never decides whether an invariant holds; it executes ops
/// and reports observations, and `shakedown-invariants` judges them against the model.
#[async_trait::async_trait]
pub trait Target: Send {
    fn name(&self) -> &'static str;

    /// Component name → version, for seed records.
    fn component_versions(&self) -> BTreeMap<String, String>;

    /// What the run prints and records once the target is up.
    fn started(&self) -> Started;

    /// Whether this target checks invariant `id` here. Match `id` exhaustively (no `_` arm).
    fn coverage(&self, id: InvariantId) -> Coverage;

    /// `Err(reason)` when this target cannot execute `op` here (the engine skips it, says why,
    /// and runs the rest of the plan). Match the op's kind exhaustively (no `_` arm).
    fn supports(&self, op: &Op) -> Result<(), Unsupported>;

    /// Executes `op`, which takes the stack from `before` to `after` in the model. A target may
    /// start sampling the stack here; samples go into every observation until [`Target::end_step`].
    async fn execute(&mut self, op: &Op, before: &Model, after: &Model) -> Result<(), TargetError>;

    /// The step's checks are done: stop what `execute` started for the step.
    async fn end_step(&mut self);

    /// Observes what the listed invariants need, including the samples of the current step.
    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation;

    /// Component logs (name, path) whose last lines go into the forensics of a failed run.
    fn log_files(&self) -> Vec<(String, PathBuf)>;

    /// Forensics that are not files on this machine (file name, contents), read before the
    /// teardown of a failed run: the application target's pod logs and events. Best effort.
    async fn forensic_extras(&mut self) -> Vec<(String, String)> {
        vec![]
    }

    /// One-line workload statistics for progress output and the event log.
    fn workload_stats(&self) -> serde_json::Value;

    /// Notes the target recorded since the last call (hook output, request counts), which the
    /// engine writes into the run's event log as `target` events.
    fn take_notes(&mut self) -> Vec<Note> {
        Vec::new()
    }

    /// `Some(why)` when the target lost the stack's control API during the run (the kube
    /// target's management cluster): what the checks read cannot be trusted, the run ends with
    /// exit 4 whatever its outcome.
    fn lost(&self) -> Option<String> {
        None
    }

    /// What an interrupted run says it did before stopping.
    fn interrupted(&self) -> &'static str {
        "interrupted: the stack was torn down"
    }

    /// Tears everything down. Idempotent.
    async fn teardown(&mut self);
}

#[cfg(test)]
mod tests {
    use super::*;
    use shakedown_faults::OpKind;

    fn app(toml: &str) -> TargetSpec {
        TargetSpec::App(app::spec::AppSpec { context: None, app_profile: app::spec::AppProfile::from_toml(toml).unwrap() })
    }

    /// An app profile without an operator, a claim or custom resources: the app tiers' plans
    /// hold only what it can run (before, 3 of `app-smoke`'s 4 steps were a skipped
    /// `operator-restart`), every seed; a profile left with nothing it can run is refused.
    #[test]
    fn app_plans_draw_only_what_the_app_profile_can_run() {
        let spec = app("namespace = \"db\"\nstatefulset = \"pg\"\n");
        for tier in ["app-smoke", "app-release", "app-database"] {
            let fitted = spec.fit(crate::profiles::load(tier).unwrap()).unwrap();
            let kinds = fitted.ops.clone().unwrap();
            assert!(kinds.contains(&OpKind::PodKill) && !kinds.contains(&OpKind::OperatorRestart), "{tier}: {kinds:?}");
            for seed in 0..50 {
                let plan = shakedown_faults::generate(seed, &fitted);
                assert_eq!(plan.ops.len(), fitted.steps, "{tier} seed {seed}: a full plan");
                for op in &plan.ops {
                    assert!(spec_supports(&spec, op), "{tier} seed {seed}: {op} drawn");
                }
            }
        }
        let mut only = crate::profiles::load("app-smoke").unwrap();
        only.ops = Some(vec![OpKind::OperatorRestart]);
        only.weights.retain(|k, _| *k == OpKind::OperatorRestart);
        let err = spec.fit(only).unwrap_err();
        assert_eq!(err.exit, crate::exit::Exit::Usage);
        assert!(err.message.contains("operator-restart (the app profile names no operator Deployment)"), "{}", err.message);
        // A profile whose kinds all run is left as it is; other targets' are never touched.
        let full = app("namespace = \"db\"\nstatefulset = \"pg\"\noperator = \"pg-operator\"\n");
        let mut smoke = crate::profiles::load("app-smoke").unwrap();
        smoke.ops = Some(vec![OpKind::PodKill, OpKind::OperatorRestart]);
        smoke.weights.retain(|k, _| matches!(k, OpKind::PodKill | OpKind::OperatorRestart));
        assert_eq!(full.fit(smoke.clone()).unwrap(), smoke);
        let nightly = crate::profiles::load("nightly").unwrap();
        assert_eq!(TargetSpec::Sim(Default::default()).fit(nightly.clone()).unwrap(), nightly);
    }

    fn spec_supports(spec: &TargetSpec, op: &shakedown_faults::Op) -> bool {
        let TargetSpec::App(a) = spec else { return true };
        a.app_profile.supports(op.kind()).is_ok()
    }
}
