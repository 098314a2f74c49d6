//! Reports people read in CI: JUnit XML (GitLab and GitHub render it) and a self-contained HTML
//! report with an SVG plot. Built from what a run leaves in its directory (`events.jsonl`,
//! `workload.csv`, `plan.toml`), so a report can be rebuilt later from the files alone.

pub mod html;
pub mod window;

use std::path::PathBuf;
use std::time::Duration;

use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};

/// The machine a run ran on, for its report: host, kernel, OS, CPUs, memory. What cannot be
/// read is left out.
pub fn machine() -> std::collections::BTreeMap<String, String> {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let mut m = std::collections::BTreeMap::new();
    if let Some(h) = read("/proc/sys/kernel/hostname") {
        m.insert("host".into(), h);
    }
    if let Some(k) = read("/proc/sys/kernel/osrelease") {
        m.insert("kernel".into(), k);
    }
    let os = read("/etc/os-release")
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|v| v.trim_matches('"').to_string()));
    if let Some(os) = os {
        m.insert("os".into(), os);
    }
    if let Ok(n) = std::thread::available_parallelism() {
        m.insert("cpus".into(), n.to_string());
    }
    let mem_kib = read("/proc/meminfo").and_then(|t| {
        t.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    if let Some(kib) = mem_kib {
        m.insert("memory".into(), format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0));
    }
    m
}

/// The invariants a target could not check, those with one reason together:
/// `a, b (why); c (why)`.
pub fn unchecked_text(unchecked: &[(shakedown_invariants::InvariantId, String)]) -> String {
    let mut by_why: Vec<(&str, Vec<String>)> = Vec::new();
    for (id, why) in unchecked {
        match by_why.iter_mut().find(|(w, _)| *w == why.as_str()) {
            Some((_, ids)) => ids.push(id.to_string()),
            None => by_why.push((why, vec![id.to_string()])),
        }
    }
    by_why.iter().map(|(why, ids)| format!("{} ({why})", ids.join(", "))).collect::<Vec<_>>().join("; ")
}

/// One seed as a JUnit test case.
#[derive(Debug, Clone)]
pub struct Case {
    /// `seed <n>`.
    pub name: String,
    pub classname: String,
    pub seconds: f64,
    /// Ops in the plan.
    pub steps: usize,
    pub run_dir: PathBuf,
    /// Invariants the profile selects that the target could not check (`id (why)`).
    pub unchecked: Vec<String>,
    pub outcome: CaseOutcome,
}

#[derive(Debug, Clone)]
pub enum CaseOutcome {
    Pass,
    Fail {
        /// `violation` or `liveness`.
        kind: String,
        invariant: Option<String>,
        message: String,
        /// `shakedown replay <record>`, when a record was written.
        replay: Option<String>,
    },
    /// Did not run to the end (interrupted, or the soak's time was up).
    Skipped(String),
}

/// JUnit XML with one test suite named `suite` and a test case per seed. A failure's message
/// ends with the command that replays it.
pub fn junit(suite: &str, cases: &[Case]) -> String {
    let mut report = Report::new("shakedown");
    let mut ts = TestSuite::new(suite);
    ts.add_property(Property::new("shakedown_version", env!("CARGO_PKG_VERSION")));
    let mut total = 0.0;
    for c in cases {
        total += c.seconds;
        let status = match &c.outcome {
            CaseOutcome::Pass => TestCaseStatus::success(),
            CaseOutcome::Fail { kind, invariant, message, replay } => {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let message = match replay {
                    Some(cmd) => format!("{message} · replay: {cmd}"),
                    None => message.clone(),
                };
                s.set_type(invariant.clone().unwrap_or_else(|| kind.clone()));
                s.set_description(format!("{message}\nrun directory: {}\n", c.run_dir.display()));
                s.set_message(message);
                s
            }
            CaseOutcome::Skipped(why) => {
                let mut s = TestCaseStatus::skipped();
                s.set_message(why.clone());
                s
            }
        };
        let mut tc = TestCase::new(c.name.clone(), status);
        tc.set_classname(c.classname.clone());
        tc.set_time(Duration::from_secs_f64(c.seconds.max(0.0)));
        tc.add_property(Property::new("steps", c.steps.to_string()));
        tc.add_property(Property::new("run_dir", c.run_dir.display().to_string()));
        if !c.unchecked.is_empty() {
            tc.add_property(Property::new("unchecked", c.unchecked.join("; ")));
        }
        ts.add_test_case(tc);
    }
    ts.set_time(Duration::from_secs_f64(total));
    report.add_test_suite(ts);
    report.to_string().unwrap_or_else(|e| format!("<!-- cannot serialize the JUnit report: {e} -->\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_counts_cases_and_ends_a_failure_with_the_replay_command() {
        let cases = vec![
            Case {
                name: "seed 1".into(),
                classname: "shakedown.smoke.local".into(),
                seconds: 3.5,
                steps: 10,
                run_dir: "/r/1".into(),
                unchecked: vec!["leases (the workload grants no leases)".into()],
                outcome: CaseOutcome::Pass,
            },
            Case {
                name: "seed 2".into(),
                classname: "shakedown.smoke.local".into(),
                seconds: 2.0,
                steps: 10,
                run_dir: "/r/2".into(),
                unchecked: vec![],
                outcome: CaseOutcome::Fail {
                    kind: "violation".into(),
                    invariant: Some("durability".into()),
                    message: "invariant durability violated at step 0 (bring-up): 3 acknowledged writes <lost>".into(),
                    replay: Some("shakedown replay seeds/seed-2.toml".into()),
                },
            },
            Case {
                name: "seed 3".into(),
                classname: "shakedown.smoke.local".into(),
                seconds: 1.0,
                steps: 10,
                run_dir: "/r/3".into(),
                unchecked: vec![],
                outcome: CaseOutcome::Skipped("time was up".into()),
            },
        ];
        let xml = junit("shakedown smoke", &cases);
        let suite = xml.lines().find(|l| l.contains("<testsuite ")).unwrap();
        for attr in [r#"name="shakedown smoke""#, r#"tests="3""#, r#"failures="1""#, r#"skipped="1""#, r#"errors="0""#] {
            assert!(suite.contains(attr), "{attr} in {suite}");
        }
        assert!(xml.contains(r#"message="invariant durability violated at step 0 (bring-up): 3 acknowledged writes &lt;lost&gt; · replay: shakedown replay seeds/seed-2.toml""#), "{xml}");
        assert!(xml.contains(r#"type="durability""#), "{xml}");
        assert!(xml.contains("<skipped message=\"time was up\""), "{xml}");
    }
}
