//! The run's event log: `events.jsonl` in the run directory, one JSON object per line, written
//! by the engine and the session and read back by the reports and the benchmarks.
//!
//! Schema (version [`SCHEMA`], in every line as `v`): every line has `v`, `ts_ms` (Unix time in
//! milliseconds) and `event`, the kind, which decides the other fields — see [`Event`]. Readers
//! skip lines they cannot parse (a run killed mid-write leaves a torn last line) and events of
//! kinds they do not know. A change that removes or retypes a field bumps [`SCHEMA`]; adding an
//! optional field or a new kind does not.
//!
//! A recording failure never breaks a run: the first write error is logged and the log goes
//! quiet.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use shakedown_faults::{Op, OpKind, Weights};
use shakedown_invariants::{InvariantId, Observation};

use crate::record::Failure;
use crate::targets::TargetSpec;

/// The version of the event schema this shakedown writes.
pub const SCHEMA: u32 = 1;

/// A check's or a liveness check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckVerdict {
    Pass,
    Fail,
}

/// What one invariant said (the kind of `shakedown_invariants::Verdict`, without its message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JudgedVerdict {
    Pass,
    /// Broken, may still converge.
    Fail,
    /// Broken for good.
    Definite,
    /// No input for it in the observation.
    Unobserved,
}

impl JudgedVerdict {
    pub fn of(v: &shakedown_invariants::Verdict) -> JudgedVerdict {
        use shakedown_invariants::Verdict;
        match v {
            Verdict::Pass => JudgedVerdict::Pass,
            Verdict::Fail(_) => JudgedVerdict::Fail,
            Verdict::Definite(_) => JudgedVerdict::Definite,
            Verdict::Unobserved(_) => JudgedVerdict::Unobserved,
        }
    }

    /// The name in the event log and the report's CSS class.
    pub fn name(self) -> &'static str {
        match self {
            JudgedVerdict::Pass => "pass",
            JudgedVerdict::Fail => "fail",
            JudgedVerdict::Definite => "definite",
            JudgedVerdict::Unobserved => "unobserved",
        }
    }
}

/// One invariant's verdict on the last observation of a check, and how long judging it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    pub invariant: InvariantId,
    pub verdict: JudgedVerdict,
    /// Judging time in microseconds.
    pub us: u64,
}

/// The checks after a step (step 0: right after bring-up).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub step: usize,
    pub verdict: CheckVerdict,
    /// Observations made until the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Milliseconds from the end of the op to the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    /// Milliseconds of the last attempt (observe + judge): the check that confirmed convergence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ms: Option<u64>,
    /// On failure: the invariant and its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invariant: Option<InvariantId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every invariant's verdict on the last observation.
    #[serde(default)]
    pub invariants: Vec<Judged>,
    /// (ms since the step began, members serving, membership size), one per change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_samples: Option<Vec<(u64, usize, usize)>>,
    /// The target's workload statistics at the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Value>,
    /// On failure: the whole observation the verdict was made on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Box<Observation>>,
}

impl Check {
    /// A failed check that only has a message (an op or a heal whose own wait ran out).
    pub fn failed(step: usize, message: &str) -> Check {
        Check {
            step,
            verdict: CheckVerdict::Fail,
            attempts: None,
            ms: None,
            last_ms: None,
            invariant: None,
            message: Some(message.to_string()),
            invariants: vec![],
            serving_samples: None,
            workload: None,
            observation: None,
        }
    }
}

/// How a run ended, in `run-end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunOutcome {
    Pass,
    Fail,
    /// Stopped on request after a checked step.
    Stopped,
    /// Stopped at once (a second Ctrl-C), or before the target was up.
    Interrupted,
}

/// One event of a run.
#[allow(clippy::large_enum_variant, reason = "one value per run or per line of the event log: boxing saves nothing that matters")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// The plan is on disk; the target is about to start.
    RunStart {
        run_id: String,
        seed: u64,
        profile: String,
        weights: Weights,
        ops: usize,
        target: TargetSpec,
    },
    /// Invariants the profile selects that the target cannot check here, each with the reason:
    /// left out of every check of the run.
    Unchecked {
        target: String,
        invariants: Vec<(InvariantId, String)>,
    },
    /// The target is up (`detail`: the target's own fields, e.g. the endpoint or the bindings).
    BringUp {
        ms: u64,
        detail: Value,
        /// What each component of the stack runs (`etcd-3.5` → `3.5.16`, `haproxy`, …).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        versions: BTreeMap<String, String>,
        /// The machine shakedown ran on (host, kernel, OS, CPUs, memory).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        machine: BTreeMap<String, String>,
    },
    OpStart {
        step: usize,
        op: Op,
        text: String,
        family: OpKind,
    },
    /// The op returned; `error` when its own wait ran out.
    OpEnd {
        step: usize,
        ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// An op the target cannot run here (or that depended on one), with the reason.
    OpSkipped {
        step: usize,
        op: Op,
        reason: String,
    },
    Check(Check),
    /// A healing op after the last step.
    Heal {
        op: Op,
        text: String,
    },
    /// The liveness check after healing (or an op whose wait ran out: `step` set).
    Liveness(Check),
    /// A stop request ended the run before step `after_step + 1`.
    Stopped {
        after_step: usize,
    },
    Forensics {
        dir: PathBuf,
        files: Vec<String>,
    },
    Teardown {
        ms: u64,
        workload: Value,
    },
    RunEnd {
        outcome: RunOutcome,
        ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    /// A known defect of the stack's releases, seen by a check (once per occurrence): named, not
    /// a failure.
    KnownDefect {
        invariant: InvariantId,
        defect: String,
        message: String,
        /// What was seen (the first part of `message`).
        #[serde(default)]
        seen: String,
        /// What the defect is (the rest of `message`).
        #[serde(default)]
        about: String,
    },
    /// Something a target recorded (`kind`: `hook`, `kube-wait`, `kube-requests`, `kube-note`, …).
    Target {
        kind: String,
        detail: Value,
    },
}

impl From<crate::targets::Note> for Event {
    fn from(n: crate::targets::Note) -> Event {
        Event::Target { kind: n.kind, detail: n.detail }
    }
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    #[serde(default = "schema_1")]
    pub v: u32,
    pub ts_ms: u64,
    #[serde(flatten)]
    pub event: Event,
}

fn schema_1() -> u32 {
    1
}

pub struct EventLog {
    out: Option<BufWriter<File>>,
}

impl EventLog {
    pub fn create(path: &Path) -> EventLog {
        match File::create(path) {
            Ok(f) => EventLog { out: Some(BufWriter::new(f)) },
            Err(e) => {
                tracing::warn!("cannot write the event log {}: {e}; going on without it", path.display());
                EventLog { out: None }
            }
        }
    }

    /// Appends the event and flushes, so a crash loses nothing.
    pub fn emit(&mut self, event: Event) {
        let Some(out) = self.out.as_mut() else { return };
        let ts_ms = crate::clock::unix_ms();
        let line = Line { v: SCHEMA, ts_ms, event };
        let res = serde_json::to_writer(&mut *out, &line)
            .map_err(std::io::Error::from)
            .and_then(|_| out.write_all(b"\n"))
            .and_then(|_| out.flush());
        if let Err(e) = res {
            tracing::warn!("event log write failed: {e}; no more events will be recorded for this run");
            self.out = None;
        }
    }
}

/// Reads an event log: every line that parses, in order (torn lines and unknown kinds skipped).
pub fn read(path: &Path) -> Result<Vec<Line>, EventsError> {
    let text = std::fs::read_to_string(path).map_err(|source| EventsError { path: path.to_path_buf(), source })?;
    Ok(parse(&text))
}

/// An event log that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}: {source}", path.display())]
pub struct EventsError {
    pub path: std::path::PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The lines of an event log's text that parse.
pub fn parse(text: &str) -> Vec<Line> {
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_torn_or_unknown_lines_are_skipped() {
        let events = vec![
            Event::RunStart {
                run_id: "sd-1".into(),
                seed: u64::MAX,
                profile: "p".into(),
                weights: Default::default(),
                ops: 2,
                target: TargetSpec::Local(Default::default()),
            },
            Event::OpStart { step: 1, op: Op::Backup, text: "backup".into(), family: OpKind::Backup },
            Event::OpEnd { step: 1, ms: 3, error: None },
            Event::Check(Check {
                step: 1,
                verdict: CheckVerdict::Pass,
                attempts: Some(1),
                ms: Some(2),
                last_ms: Some(2),
                invariant: None,
                message: None,
                invariants: vec![],
                serving_samples: Some(vec![(1, 3, 3)]),
                workload: None,
                observation: None,
            }),
            Event::Target { kind: "hook".into(), detail: serde_json::json!({"exit": 0}) },
            Event::RunEnd { outcome: RunOutcome::Pass, ms: 9, failure: None },
        ];
        let mut text = String::new();
        for (i, e) in events.iter().enumerate() {
            text.push_str(&serde_json::to_string(&Line { v: SCHEMA, ts_ms: i as u64, event: e.clone() }).unwrap());
            text.push('\n');
        }
        assert!(text.lines().all(|l| l.starts_with("{\"v\":1,\"ts_ms\":")), "{text}");
        assert!(text.contains("\"event\":\"op-start\"") && text.contains("\"seed\":18446744073709551615"), "{text}");
        text.push_str("{\"v\":1,\"ts_ms\":9,\"event\":\"from-the-future\"}\n{\"v\":1,\"ts_ms\":10,\"event\":\"op-e");
        let back: Vec<Event> = parse(&text).into_iter().map(|l| l.event).collect();
        assert_eq!(back, events);
    }
}
