//! Seed records: the TOML file written when a run fails, replayable on its own — seed, profile
//! (inline), component versions, the explicit op list, the failing step and the violation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shakedown_faults::{Plan, Profile};
use shakedown_invariants::InvariantId;

use crate::exit::Fatal;
use crate::targets::TargetSpec;

/// The seed record format this shakedown writes. Format 2: the stack is a typed `[target]`
/// table (`kind = "local" | "kube"` and that target's fields).
pub const FORMAT: u32 = 2;

/// The oldest format it still reads: format 1 (`target = "local"`, a top-level `testbed_bug`,
/// a `[kube]` table) is converted on load.
pub const OLDEST_FORMAT: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// A safety invariant broke after (or during) a step.
    Violation,
    /// After healing, the stack did not converge within the bound; or an op's own wait ran out.
    Liveness,
}

/// What replaying a record should show, for a regression corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// The failure still reproduces: kept to show that shakedown detects it.
    #[default]
    Fail,
    /// The bug is fixed: the plan passes.
    Pass,
}

/// When a replayed run counts as reproducing a recorded failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Match {
    /// The same failure kind and invariant at the same step.
    #[default]
    Step,
    /// The same failure kind and invariant at any step: for timing-bound defects whose step
    /// moves from run to run.
    Invariant,
    /// A failure of any kind, invariant or step whose message names the same known defect
    /// (every upstream issue the recorded message's "Known etcd defect" notes cite, such as
    /// etcd-io/etcd#18667): for a root-caused defect that several checks can be the first to
    /// see (a diverged store caught by `consistency` after a step in one run, by the heal's
    /// convergence in the next).
    Defect,
}

/// The upstream issues a failure message's known-defect notes cite (`Known etcd defect: …
/// (etcd-io/etcd#18667; …)`), in the order met; known *behaviour* notes (raft without pre-vote)
/// are not defects and are left out.
pub fn known_defects(message: &str) -> Vec<String> {
    const NOTE: &str = "Known etcd defect:";
    let mut out: Vec<String> = Vec::new();
    for note in message.split(NOTE).skip(1) {
        // The note runs to the next note of any kind.
        let note = note.split("Known etcd").next().unwrap_or(note);
        let mut rest = note;
        while let Some(i) = rest.find("etcd-io/etcd#") {
            let after = &rest[i + "etcd-io/etcd#".len()..];
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() {
                let id = format!("etcd-io/etcd#{digits}");
                if !out.contains(&id) {
                    out.push(id);
                }
            }
            rest = after;
        }
    }
    out
}

impl Match {
    /// Whether `got` fails the way `expected` did: the same kind and invariant, and (for
    /// [`Match::Step`]) at the same step. The invariant counts when it is `got`'s headline or
    /// one of the others violated in the same check (which one heads a check that breaks
    /// several is the order they are judged in, not what the bug did).
    pub fn matches(self, expected: &Failure, got: &Failure) -> bool {
        if self == Match::Defect {
            let (want, seen) = (known_defects(&expected.message), known_defects(&got.message));
            return !want.is_empty() && want.iter().all(|d| seen.contains(d));
        }
        let invariant = got.invariant == expected.invariant || expected.invariant.is_some_and(|i| got.also.contains(&i));
        got.kind == expected.kind && invariant && (self == Match::Invariant || got.step == expected.step)
    }

    pub fn name(self) -> &'static str {
        match self {
            Match::Step => "step",
            Match::Invariant => "invariant",
            Match::Defect => "defect",
        }
    }
}

/// Which of a record's plans ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhichPlan {
    /// The recorded plan (the record has no shrunk plan, or `--original`).
    Original,
    /// The shrunk plan.
    Shrunk,
}

/// One measurement of how often replaying a record reproduces its failure (`replay --times N
/// --write-rate`). A record keeps every measurement: rates on different versions are the point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reproduction {
    /// Replays run.
    pub runs: u32,
    /// Replays that reproduced the failure.
    pub reproduced: u32,
    /// How a replay had to fail to count.
    pub matched: Match,
    /// The plan replayed.
    pub plan: WhichPlan,
    /// The component versions the replays ran with (`--etcd VERSION=PATH` changes them).
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
    /// When the measurement ended (RFC 3339, UTC).
    pub at: String,
}

impl Reproduction {
    pub fn rate(&self) -> f64 {
        if self.runs == 0 {
            0.0
        } else {
            self.reproduced as f64 / self.runs as f64
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    pub kind: FailureKind,
    /// 1-based index of the failing op; 0 = right after bring-up; ops + 1 = after healing.
    pub step: usize,
    /// The op of that step, as text.
    pub op: String,
    pub invariant: Option<InvariantId>,
    /// The other invariants violated in the same check (the message names them too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<InvariantId>,
    pub message: String,
    /// When it was detected (RFC 3339, UTC).
    pub at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedRecord {
    pub format: u32,
    pub shakedown_version: String,
    #[serde(with = "shakedown_faults::seed")]
    pub seed: u64,
    pub run_id: String,
    /// When the run started (RFC 3339, UTC).
    pub started: String,
    /// Wall time of the recorded run, bring-up to detection (tells `shrink` what a candidate costs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// What `shakedown replay DIR` expects of this record (edit to `"pass"` once fixed).
    #[serde(default)]
    pub expect: Expect,
    /// How a replay must fail to count as reproducing this record (absent: the same step);
    /// `replay --match` overrides it.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matching: Option<Match>,
    /// Component versions the failure was seen with.
    pub versions: BTreeMap<String, String>,
    /// The stack the plan ran on (for the local target: its planted bug; for the kube target:
    /// the Cluster, context and kube profile).
    pub target: TargetSpec,
    pub failure: Failure,
    pub profile: Profile,
    pub plan: Plan,
    /// The smallest plan `shakedown shrink` found that fails the same way; `replay` runs it
    /// unless told `--original`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrunk: Option<Shrunk>,
    /// Measured reproduction rates (`replay --write-rate`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reproduction: Vec<Reproduction>,
}

/// The result of shrinking a record's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shrunk {
    /// Candidate executions it took.
    pub runs: u32,
    /// True when the plan is 1-minimal (removing any one op made the failure go away); false
    /// when the budget ran out or the shrink was interrupted first.
    pub complete: bool,
    /// When it finished (RFC 3339, UTC).
    pub at: String,
    /// How the shrunk plan failed.
    pub failure: Failure,
    pub ops: Vec<shakedown_faults::Op>,
    /// A candidate counted as failing when it failed the same way in `needs` of up to
    /// `confirm` runs (absent in records shrunk before these were noted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<u32>,
    /// How a candidate had to fail to count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<Match>,
}

impl SeedRecord {
    /// Where this record goes in `dir`: `seed-<seed>-<invariant or kind>-<run id>.toml`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        let what = self.failure.invariant.map(|i| i.to_string()).unwrap_or_else(|| format!("{:?}", self.failure.kind).to_lowercase());
        dir.join(format!("seed-{}-{what}-{}.toml", self.seed, self.run_id))
    }

    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("a seed record always serializes");
        format!("# shakedown seed record: replay with `shakedown replay <this file>`\n{body}")
    }

    /// Writes the record atomically (temp file + rename), so a crash never leaves half a record.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = self.path_in(dir);
        self.rewrite(&path)?;
        Ok(path)
    }

    /// Every `*.toml` file of a corpus directory, sorted, each checked; the first file that is
    /// not a valid seed record is an error naming it (nothing is replayed then).
    pub fn load_dir(dir: &Path) -> Result<Vec<(PathBuf, SeedRecord)>, Fatal> {
        let entries = std::fs::read_dir(dir).map_err(|e| Fatal::usage(format!("cannot read {}: {e}", dir.display())))?;
        let mut paths: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml")).collect();
        paths.sort();
        if paths.is_empty() {
            return Err(Fatal::usage(format!("{} holds no seed records (*.toml)", dir.display())));
        }
        paths.into_iter().map(|p| Self::load(&p).map(|r| (p, r))).collect()
    }

    /// The plan and the failure `replay` reproduces: the shrunk ones when present, unless
    /// `original`.
    pub fn to_replay(&self, original: bool) -> (Plan, &Failure) {
        match &self.shrunk {
            Some(s) if !original => (Plan { ops: s.ops.clone(), ..self.plan.clone() }, &s.failure),
            _ => (self.plan.clone(), &self.failure),
        }
    }

    /// Which plan `to_replay(original)` runs.
    pub fn which_plan(&self, original: bool) -> WhichPlan {
        if self.shrunk.is_some() && !original {
            WhichPlan::Shrunk
        } else {
            WhichPlan::Original
        }
    }

    /// The reproduction rate a corpus replay plans with: the lowest non-zero rate measured
    /// with `matching` on the plan it replays (the most cautious: it asks for the most runs).
    /// `None` when no such measurement saw the failure at all. A rate of 0 is a statement about
    /// the versions it was measured on (a fixed etcd), not a rate to plan with.
    pub fn planning_rate(&self, matching: Match, plan: WhichPlan) -> Option<f64> {
        self.reproduction
            .iter()
            .filter(|r| r.matched == matching && r.plan == plan && r.reproduced > 0)
            .map(Reproduction::rate)
            .min_by(|a, b| a.total_cmp(b))
    }

    /// Replaces the record at `path` atomically (temp file + rename): an interrupted write
    /// leaves the old record intact.
    pub fn rewrite(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, self.to_toml())?;
        std::fs::rename(&tmp, path)
    }

    /// Reads and checks a record: format version, shape, profile and plan preconditions.
    pub fn load(path: &Path) -> Result<SeedRecord, Fatal> {
        let text = std::fs::read_to_string(path).map_err(|e| Fatal::usage(format!("cannot read seed record {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| Fatal::usage(format!("{}: {e}", path.display())))
    }

    pub fn parse(text: &str) -> Result<SeedRecord, RecordError> {
        let value: toml::Table =
            text.parse().map_err(|e: toml::de::Error| located("not a valid seed record (malformed or truncated TOML)", text, &e))?;
        let record: SeedRecord = match value.get("format").and_then(|v| v.as_integer()) {
            None => return Err(RecordError::NoFormat),
            Some(1) => from_format_1(value)?,
            Some(f) if f == FORMAT as i64 => {
                let filled = with_workload_kind(value.clone());
                if filled == value {
                    // Read from the text itself, so that an error says where.
                    toml::from_str(text).map_err(|e: toml::de::Error| located("not a valid seed record", text, &e))?
                } else {
                    toml::Value::Table(filled).try_into().map_err(|e: toml::de::Error| RecordError::Toml {
                        what: "not a valid seed record",
                        at: None,
                        message: e.message().to_string(),
                    })?
                }
            }
            Some(f) => return Err(RecordError::UnsupportedFormat { format: f }),
        };
        record.profile.validate()?;
        if record.matching == Some(Match::Defect) && known_defects(&record.failure.message).is_empty() {
            return Err(RecordError::NoKnownDefect);
        }
        // The target's own profile is held to its loader's rules too: a record is replayed as
        // it reads, and an edited one must not reach a cluster with a zero bound or an empty name.
        match &record.target {
            TargetSpec::Kube(k) => {
                k.kube_profile.validate().map_err(|e| RecordError::TargetProfile { which: "kube", detail: e.to_string() })?
            }
            TargetSpec::App(a) => {
                a.app_profile.validate().map_err(|e| RecordError::TargetProfile { which: "app", detail: e.to_string() })?
            }
            TargetSpec::Local(_) | TargetSpec::Sim(_) => {}
        }
        crate::profiles::invariants(&record.profile).map_err(|e| RecordError::Invariants { detail: e.to_string() })?;
        if let Some(detail) = record.plan.etcd_problem(&record.profile) {
            return Err(RecordError::EtcdFlags { detail });
        }
        // The model starts from the stack the recorded flags start (the failpoints it can reach).
        let initial = record.plan.run_profile(&record.profile).initial_model();
        if let Err((i, e)) = record.plan.validate(initial.clone()) {
            return Err(RecordError::Plan { which: "recorded", step: i + 1, op: record.plan.ops[i].to_string(), source: e });
        }
        // 0 is the bring-up, ops + 1 the check after healing: a step past that names no check.
        let n = record.plan.ops.len();
        if record.failure.step > n + 1 {
            return Err(RecordError::StepPastPlan { step: record.failure.step, ops: n });
        }
        let (shrunk, _) = record.to_replay(false);
        if let Err((i, e)) = shrunk.validate(initial) {
            return Err(RecordError::Plan { which: "shrunk", step: i + 1, op: shrunk.ops[i].to_string(), source: e });
        }
        Ok(record)
    }
}

/// Why a seed record cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not TOML, or not a record's shape; `at` is the (line, column) the error points at.
    #[error("{what}{}: {message}", at.map(|(l, c)| format!(" at line {l}, column {c}")).unwrap_or_default())]
    Toml { what: &'static str, at: Option<(usize, usize)>, message: String },
    #[error("not a shakedown seed record: no integer `format` key")]
    NoFormat,
    /// `match = "defect"` on a failure whose message names no known defect: nothing to match.
    #[error("match = \"defect\" needs a failure whose message names a known etcd defect (\"Known etcd defect: … (etcd-io/etcd#N)\"); this one names none: use match = \"invariant\" or \"step\"")]
    NoKnownDefect,
    #[error("seed record format {format} is not supported by shakedown {} (it reads formats {OLDEST_FORMAT} to {FORMAT}); use the shakedown version that wrote it", env!("CARGO_PKG_VERSION"))]
    UnsupportedFormat { format: i64 },
    /// A format-1 record that today's shape cannot hold (`detail` names what).
    #[error("not a valid seed record (format 1): {detail}")]
    Format1 { detail: String },
    /// The recorded profile is not valid.
    #[error(transparent)]
    Profile(#[from] shakedown_faults::ProfileError),
    /// The recorded profile's invariants are not valid.
    #[error("{detail}")]
    Invariants { detail: String },
    /// The recorded plan's etcd flags are not what its profile pins and draws.
    #[error("{detail}")]
    EtcdFlags { detail: String },
    /// The recorded (or shrunk) plan breaks a precondition at `step` (1-based).
    #[error("the {which} plan is not valid: step {step} ({op}) breaks its precondition: {source}")]
    Plan {
        which: &'static str,
        step: usize,
        op: String,
        #[source]
        source: shakedown_faults::PreconditionError,
    },
    #[error("failure.step = {step} is past the recorded plan's {ops} ops (0 is the bring-up, {} the check after healing)", ops + 1)]
    StepPastPlan { step: usize, ops: usize },
    /// The recorded target's own profile (a kube or an app profile) breaks a rule its loader has.
    #[error("the recorded {which} profile is not valid: {detail}")]
    TargetProfile { which: &'static str, detail: String },
}

/// A TOML error with the line and column it points at, as profile errors have.
fn located(what: &'static str, text: &str, e: &toml::de::Error) -> RecordError {
    let at = e.span().map(|span| {
        let before = text.get(..span.start).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    });
    RecordError::Toml { what, at, message: e.message().trim_end().to_string() }
}

/// Records written before the workload had kinds ran the unique-key `puts` writer: a recorded
/// profile without `workload.kind` replays with it, not with today's default.
fn with_workload_kind(mut t: toml::Table) -> toml::Table {
    if let Some(toml::Value::Table(p)) = t.get_mut("profile") {
        let w = p.entry("workload").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(w) = w {
            w.entry("kind").or_insert_with(|| toml::Value::String("puts".into()));
        }
    }
    t
}

/// A format-1 record in today's shape: `target = "local"` and `testbed_bug`, or `target =
/// "kube"` and `[kube]`, become the `[target]` table. Anything else a format-1 record cannot hold is an
/// error naming it.
fn from_format_1(mut t: toml::Table) -> Result<SeedRecord, RecordError> {
    let bad = |detail: String| RecordError::Format1 { detail };
    let kind = match t.remove("target") {
        Some(toml::Value::String(k)) => k,
        Some(other) => return Err(bad(format!("`target` must be a string, found {}", other.type_str()))),
        None => return Err(bad("no `target` key".into())),
    };
    let bug = t.remove("testbed_bug");
    let kube = t.remove("kube");
    let mut spec = toml::Table::new();
    spec.insert("kind".into(), toml::Value::String(kind.clone()));
    match (kind.as_str(), kube) {
        ("local", None) => {
            if let Some(b) = bug {
                spec.insert("testbed_bug".into(), b);
            }
        }
        ("kube", Some(toml::Value::Table(k))) if bug.is_none() => spec.extend(k),
        ("kube", _) => return Err(bad("a kube record needs its [kube] table and no testbed_bug".into())),
        ("local", Some(_)) => return Err(bad("a local record with a [kube] table".into())),
        (other, _) => return Err(bad(format!("unknown target {other:?} (known: local, kube)"))),
    }
    t.insert("target".into(), toml::Value::Table(spec));
    t.insert("format".into(), toml::Value::Integer(FORMAT as i64));
    with_workload_kind(t).try_into().map_err(|e: toml::de::Error| bad(e.message().to_string()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(seed: u64) -> SeedRecord {
        let mut profile = crate::profiles::load("default").unwrap();
        profile.steps = 5;
        let plan = shakedown_faults::generate(seed, &profile);
        SeedRecord {
            format: FORMAT,
            shakedown_version: "0.0.0".into(),
            seed,
            run_id: "sd-00000000".into(),
            started: "2026-12-01T00:00:00Z".into(),
            duration_ms: Some(1),
            expect: Expect::Fail,
            versions: BTreeMap::new(),
            target: TargetSpec::Local(Default::default()),
            failure: Failure {
                kind: FailureKind::Violation,
                step: 1,
                op: plan.ops[0].to_string(),
                invariant: Some(InvariantId::Durability),
                also: vec![],
                message: "m".into(),
                at: "2026-12-01T00:00:00Z".into(),
            },
            profile,
            plan,
            shrunk: None,
            matching: None,
            reproduction: Vec::new(),
        }
    }

    /// The shipped corpus is format 1: it still loads, and its target moves into `[target]`.
    #[test]
    fn format_1_records_load_as_today_s_shape() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        let records = SeedRecord::load_dir(&dir).unwrap();
        assert!(records.len() >= 4);
        let format_1 = |p: &std::path::Path| std::fs::read_to_string(p).unwrap().contains("format = 1");
        assert!(records.iter().filter(|(p, _)| format_1(p)).count() >= 4, "the four format-1 records are kept as written");
        for (path, r) in records.iter().filter(|(p, _)| format_1(p)) {
            assert_eq!(r.format, FORMAT);
            assert!(matches!(r.target, TargetSpec::Local(_)));
            // Written back, it is a format-2 record that loads as the same record.
            assert_eq!(&SeedRecord::parse(&r.to_toml()).unwrap(), r);
            // They ran the unique-key writer, and replay with it.
            assert_eq!(r.profile.workload.kind, shakedown_faults::WorkloadKind::Puts, "{}", path.display());
        }
        // The format-2 ones (the simulated target's) load and write back unchanged too.
        for (path, r) in records.iter().filter(|(p, _)| !format_1(p)) {
            assert_eq!(&SeedRecord::parse(&r.to_toml()).unwrap(), r, "{}", path.display());
        }
        // A record written today keeps the workload it ran.
        let today = record(1);
        assert_eq!(today.profile.workload.kind, shakedown_faults::WorkloadKind::Kube);
        assert_eq!(SeedRecord::parse(&today.to_toml()).unwrap().profile.workload.kind, shakedown_faults::WorkloadKind::Kube);
        let bugs: Vec<_> = records
            .iter()
            .filter_map(|(_, r)| match &r.target {
                TargetSpec::Local(l) => l.testbed_bug,
                _ => None,
            })
            .collect();
        assert_eq!(bugs.len(), 3, "three planted-bug records");
        let kube1 = "format = 1\nshakedown_version = \"0.1.0\"\nseed = 1\ntarget = \"kube\"\n";
        assert!(SeedRecord::parse(kube1).unwrap_err().to_string().contains("needs its [kube] table"));
        assert!(SeedRecord::parse("format = 1\ntarget = \"moon\"\n").unwrap_err().to_string().contains("unknown target \"moon\""));
        assert!(SeedRecord::parse("format = 3\n").unwrap_err().to_string().contains("reads formats 1 to 2"));
    }

    /// A record of a profile that draws etcd's flags keeps the flags its run used in its plan
    /// (`[plan.etcd]`) and loads back the same; replay runs with those, not with a fresh draw (an
    /// edited value is what replays). Records without them, every record written before flags
    /// could be drawn, run with their profile's `[etcd]`; a drawing profile's record without them
    /// is refused.
    #[test]
    fn a_record_carries_its_drawn_etcd_flags_and_replays_with_them() {
        let mut r = record(11);
        r.profile.etcd = shakedown_faults::EtcdFlags { draw: shakedown_faults::EtcdFlag::ALL.to_vec(), ..Default::default() };
        r.plan = shakedown_faults::generate(11, &r.profile);
        r.failure.op = r.plan.ops[0].to_string();
        r.shrunk = Some(Shrunk {
            runs: 3,
            complete: true,
            at: "2026-12-01T00:00:00Z".into(),
            failure: r.failure.clone(),
            ops: r.plan.ops[..1].to_vec(),
            confirm: None,
            needs: None,
            matched: None,
        });
        let drawn = r.plan.etcd.clone().expect("a profile that draws gives its plan flags");
        let text = r.to_toml();
        assert!(text.contains("[plan.etcd]\nsnapshot_count = "), "{text}");
        assert!(text.contains("draw = [\"snapshot_count\", \"heartbeat\", \"election\", \"compaction_batch_limit\"]"), "{text}");
        let back = SeedRecord::parse(&text).unwrap();
        assert_eq!(back, r);
        for original in [true, false] {
            let (plan, _) = back.to_replay(original);
            assert_eq!(plan.run_profile(&back.profile).etcd, drawn, "original {original}: replays with the recorded flags");
        }
        // Another value than the seed draws (as a record of an older generation would have):
        // the recorded one is what runs.
        let other = shakedown_faults::profile::DRAWN_SNAPSHOT_COUNTS.into_iter().find(|n| Some(*n) != drawn.snapshot_count).unwrap();
        let edited = text.replace(
            &format!("[plan.etcd]\nsnapshot_count = {}", drawn.snapshot_count.unwrap()),
            &format!("[plan.etcd]\nsnapshot_count = {other}"),
        );
        let edited = SeedRecord::parse(&edited).unwrap();
        assert_eq!(edited.plan.run_profile(&edited.profile).etcd.snapshot_count, Some(other));
        // Without its flags, the record of a drawing profile is refused, saying why.
        let mut bare = r.clone();
        bare.plan.etcd = None;
        let e = SeedRecord::parse(&bare.to_toml()).unwrap_err().to_string();
        assert!(e.contains("the plan has no [plan.etcd] flags, but profile default draws snapshot_count, heartbeat, election"), "{e}");
        // The corpus (written before flags could be drawn) runs with its profiles' own.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        for (path, old) in SeedRecord::load_dir(&dir).unwrap() {
            assert_eq!(old.plan.etcd, None, "{}", path.display());
            assert_eq!(old.plan.run_profile(&old.profile), old.profile, "{}", path.display());
        }
    }

    fn reproduction(runs: u32, reproduced: u32, matched: Match, etcd: &str) -> Reproduction {
        Reproduction {
            runs,
            reproduced,
            matched,
            plan: WhichPlan::Original,
            versions: BTreeMap::from([("etcd-3.5".to_string(), etcd.to_string())]),
            at: "2026-12-01T00:00:00Z".into(),
        }
    }

    /// Issue 12: measured rates are a list of `[[reproduction]]` tables that round-trip; a
    /// record without them (every record written before) loads with none.
    #[test]
    fn reproduction_rates_round_trip_and_old_records_have_none() {
        let mut r = record(7);
        let old = r.to_toml();
        assert!(!old.contains("reproduction") && !old.contains("match ="), "{old}");
        assert_eq!(SeedRecord::parse(&old).unwrap().reproduction, vec![]);
        r.matching = Some(Match::Invariant);
        r.reproduction = vec![reproduction(8, 2, Match::Invariant, "3.5.1"), reproduction(8, 0, Match::Invariant, "3.5.16")];
        let text = r.to_toml();
        assert_eq!(text.matches("[[reproduction]]").count(), 2, "{text}");
        assert!(text.contains("match = \"invariant\"") && text.contains("matched = \"invariant\""), "{text}");
        assert_eq!(SeedRecord::parse(&text).unwrap(), r);
    }

    #[test]
    fn the_planning_rate_is_the_lowest_non_zero_rate_measured_the_same_way() {
        let mut r = record(7);
        assert_eq!(r.planning_rate(Match::Step, WhichPlan::Original), None);
        r.reproduction = vec![
            reproduction(8, 4, Match::Step, "3.5.1"),
            reproduction(8, 2, Match::Step, "3.5.1"),
            reproduction(8, 0, Match::Step, "3.5.16"),
            reproduction(4, 1, Match::Invariant, "3.5.1"),
        ];
        assert_eq!(r.planning_rate(Match::Step, WhichPlan::Original), Some(0.25));
        assert_eq!(r.planning_rate(Match::Invariant, WhichPlan::Original), Some(0.25));
        assert_eq!(r.planning_rate(Match::Step, WhichPlan::Shrunk), None, "measured on the other plan");
        r.reproduction.truncate(0);
        r.reproduction.push(reproduction(8, 0, Match::Step, "3.5.16"));
        assert_eq!(r.planning_rate(Match::Step, WhichPlan::Original), None, "never seen: nothing to plan with");
    }

    #[test]
    fn matching_by_known_defect_whatever_saw_it() {
        let note = "Known etcd defect: the workload sent 9 transaction(s) … (etcd-io/etcd#18667; docs/findings.md, finding 7)";
        let f = |kind: FailureKind, step: usize, invariant: Option<InvariantId>, message: String| Failure {
            kind,
            step,
            op: "defrag(m0)".into(),
            invariant,
            also: vec![],
            message,
            at: String::new(),
        };
        let recorded = f(FailureKind::Violation, 4, Some(InvariantId::Consistency), format!("members disagree. {note}"));
        // Seen by the heal's convergence in another run, beside a known behaviour note.
        let at_heal = f(
            FailureKind::Liveness,
            5,
            None,
            format!("did not converge: a replica diverged. {note}; in the same check members: no leader. Known etcd behaviour: raft without pre-vote (etcd-io/etcd#9333, #12959)"),
        );
        assert_eq!(known_defects(&at_heal.message), vec!["etcd-io/etcd#18667".to_string()], "behaviour notes are no defects");
        assert!(Match::Defect.matches(&recorded, &at_heal));
        assert!(!Match::Invariant.matches(&recorded, &at_heal), "another kind: only the defect matches it");
        let other = f(FailureKind::Violation, 4, Some(InvariantId::Consistency), "members disagree".into());
        assert!(!Match::Defect.matches(&recorded, &other), "the same invariant without the defect");
        assert!(!Match::Defect.matches(&other, &other), "a record that names no defect matches nothing by defect");
    }

    #[test]
    fn a_defect_match_needs_a_recorded_defect() {
        let mut r = record(3);
        r.matching = Some(Match::Defect);
        assert!(matches!(SeedRecord::parse(&r.to_toml()), Err(RecordError::NoKnownDefect)));
        r.failure.message += ". Known etcd defect: … (etcd-io/etcd#18667)";
        assert_eq!(SeedRecord::parse(&r.to_toml()).unwrap().matching, Some(Match::Defect));
    }

    #[test]
    fn matching_by_step_or_by_invariant() {
        let r = record(7);
        let f = r.failure.clone();
        let later = Failure { step: 4, ..f.clone() };
        let other = Failure { invariant: Some(InvariantId::Consistency), ..f.clone() };
        let liveness = Failure { kind: FailureKind::Liveness, ..f.clone() };
        assert!(Match::Step.matches(&f, &f) && Match::Invariant.matches(&f, &f));
        assert!(!Match::Step.matches(&f, &later) && Match::Invariant.matches(&f, &later));
        for m in [Match::Step, Match::Invariant] {
            assert!(!m.matches(&f, &other) && !m.matches(&f, &liveness));
        }
        // Another invariant heads the check, the recorded one broke in it too: reproduced
        // (a replay of a planted bug caught by `watch` headed its check with `durability`).
        let also = Failure { also: vec![f.invariant.unwrap()], ..other.clone() };
        assert!(Match::Step.matches(&f, &also) && Match::Invariant.matches(&f, &also));
        assert!(!Match::Step.matches(&f, &Failure { step: 4, ..also }));
    }

    /// A record's kube or app profile is held to its loader's rules: an edited record with a
    /// zero rollout bound or an empty namespace is refused before anything connects.
    #[test]
    fn a_records_kube_or_app_profile_is_held_to_its_loaders_rules() {
        use crate::targets::app::spec::{AppProfile, AppSpec};
        use crate::targets::kube::profile::KubeProfile;
        use crate::targets::kube::KubeSpec;
        let mut r = record(3);
        let mut kp = KubeProfile::from_toml("").unwrap();
        r.target = TargetSpec::Kube(KubeSpec { cluster: "ns/c".into(), context: None, kube_profile: kp.clone() });
        SeedRecord::parse(&r.to_toml()).unwrap();
        kp.timeouts.rollout = std::time::Duration::ZERO;
        r.target = TargetSpec::Kube(KubeSpec { cluster: "ns/c".into(), context: None, kube_profile: kp });
        let e = SeedRecord::parse(&r.to_toml()).unwrap_err().to_string();
        assert!(e.contains("the recorded kube profile is not valid") && e.contains("rollout must be more than zero"), "{e}");
        let mut ap = AppProfile::from_toml("namespace = \"db\"\nstatefulset = \"db\"\n").unwrap();
        ap.namespace = String::new();
        r.target = TargetSpec::App(AppSpec { context: None, app_profile: ap });
        let e = SeedRecord::parse(&r.to_toml()).unwrap_err().to_string();
        assert!(e.contains("the recorded app profile is not valid") && e.contains("namespace"), "{e}");
    }

    proptest! {
        /// Every u64 seed writes a record that loads back as the same record (issue 10: seeds
        /// above i64::MAX used to make writing the record panic).
        #[test]
        fn every_u64_seed_records_and_loads_back(seed in any::<u64>(), high in any::<bool>()) {
            let seed = if high { seed | (1 << 63) } else { seed };
            let r = record(seed);
            let back = SeedRecord::parse(&r.to_toml()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, r);
        }

        /// A record with any of its numbers replaced by any integer — negative, zero, past
        /// u32 or i64 — or with any text spliced in anywhere, loads or is refused with a
        /// reason: never a panic, never an error without words.
        #[test]
        fn any_number_or_spliced_text_in_a_record_loads_or_is_refused_without_panic(
            seed in any::<u64>(),
            which in 0usize..64,
            value in prop_oneof![any::<i64>(), Just(i64::MAX), Just(i64::MIN), Just(-1i64), Just(0i64), Just(u32::MAX as i64 + 1)],
            at in any::<prop::sample::Index>(),
            splice in ".{0,40}",
        ) {
            let text = record(seed).to_toml();
            // The n-th line of the form `key = <integer>` (wrapping), its value replaced: the
            // seed, steps, members, sites, weights, failure.step, each op's member, site, backup.
            let numeric: Vec<usize> = text.lines().enumerate()
                .filter(|(_, l)| l.split_once(" = ").is_some_and(|(_, v)| v.trim().parse::<i64>().is_ok()))
                .map(|(i, _)| i)
                .collect();
            prop_assume!(!numeric.is_empty());
            let target = numeric[which % numeric.len()];
            let changed: String = text.lines().enumerate()
                .map(|(i, l)| if i == target { format!("{} = {value}\n", l.split_once(" = ").unwrap().0) } else { format!("{l}\n") })
                .collect();
            if let Err(e) = SeedRecord::parse(&changed) {
                prop_assert!(!e.to_string().trim().is_empty());
            }
            let mut cut = at.index(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let spliced = format!("{}{splice}{}", &text[..cut], &text[cut..]);
            if let Err(e) = SeedRecord::parse(&spliced) {
                prop_assert!(!e.to_string().trim().is_empty());
            }
        }
    }
}
