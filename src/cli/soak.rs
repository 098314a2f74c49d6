//! `shakedown soak --for DURATION`: seed after seed on fresh stacks until the time is up,
//! every failure recorded; a live progress line, a summary table, JUnit XML and an HTML index.
//!
//! Memory stays flat: each run streams its events and workload samples to its own directory;
//! the soak keeps only counters and one small row per seed (also streamed to `soak.jsonl`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::Outcome;
use crate::exit::{Exit, Fatal};
use crate::faults::{OpKind, Profile};
use crate::record::FailureKind;
use crate::report::{self, html::SoakSummary, Case};
use crate::targets::TargetSpec;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use super::session::{case_of, create_run_dir, execute, new_run_id, progress_line, remove_if_holding_only, Exec, Interrupt, Interrupted};
use super::RunOpts;

/// How often the progress line redraws on a terminal.
const PROGRESS_TICK: Duration = Duration::from_millis(200);

pub struct SoakArgs {
    pub duration: Duration,
    pub first_seed: u64,
    pub max_failures: Option<u32>,
    /// This soak's share of the seed space (`--partition i/n`): seeds S+i, S+i+n, …
    pub partition: super::Partition,
    /// `--junit PATH`: the soak's JUnit XML, also written there.
    pub junit: Option<PathBuf>,
    pub profile: Profile,
    pub spec: TargetSpec,
}

/// One seed of a soak, as its line of `soak.jsonl` has it (what `merge` reads back).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SeedLine {
    pub seed: u64,
    /// `PASS`, `FAIL <invariant or liveness> at step N: <message>`, or `cut short after N steps`.
    pub verdict: String,
    /// Steps run (for a failure: up to the failing one).
    pub steps: usize,
    /// A failure's kind (a lost safety property or a stack that did not converge); absent
    /// for a seed that did not fail, and in lines written before it was recorded (a failure is
    /// then a violation unless it names `liveness`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    pub ms: u64,
    pub run_dir: PathBuf,
    pub record: Option<PathBuf>,
    /// Known defects of the stack's releases seen in the run, by upstream issue.
    #[serde(default)]
    pub known_defects: BTreeMap<String, u64>,
    /// Seconds since the soak started, when the seed ended.
    pub elapsed_s: f64,
    pub rss_kib: u64,
    pub rss_anon_kib: u64,
}

impl SeedLine {
    /// What failed (an invariant's name, or `liveness`) when the seed failed.
    fn failed(&self) -> Option<&str> {
        self.verdict.strip_prefix("FAIL ").and_then(|r| r.split(" at step ").next())
    }

    /// Whether the seed lost a safety property (not merely a stack that did not converge).
    fn violated(&self) -> bool {
        match (self.failure, self.failed()) {
            (Some(kind), _) => kind == FailureKind::Violation,
            (None, what) => what.is_some_and(|w| w != "liveness"),
        }
    }

    /// The seed as a JUnit case of class `classname`.
    pub fn case(&self, classname: &str) -> Case {
        let outcome = match self.failed() {
            Some(what) => report::CaseOutcome::Fail {
                kind: if self.violated() { "violation" } else { "liveness" }.into(),
                invariant: (what != "liveness").then(|| what.to_string()),
                message: self.verdict.split_once(": ").map_or(self.verdict.as_str(), |(_, m)| m).to_string(),
                replay: self.record.as_ref().map(|p| format!("shakedown replay {}", p.display())),
            },
            None if self.verdict == "PASS" => report::CaseOutcome::Pass,
            None => report::CaseOutcome::Skipped(self.verdict.clone()),
        };
        Case {
            name: format!("seed {}", self.seed),
            classname: classname.to_string(),
            seconds: self.ms as f64 / 1000.0,
            steps: self.steps,
            run_dir: self.run_dir.clone(),
            unchecked: vec![],
            outcome,
        }
    }
}

#[derive(Default)]
pub struct Tally {
    seeds: u64,
    passed: u64,
    failed: u64,
    cut: u64,
    steps: u64,
    ops: BTreeMap<OpKind, u64>,
    failures: BTreeMap<String, u64>,
    /// Known defects of the stack's releases seen, by upstream issue (occurrences, seeds).
    known: BTreeMap<String, (u64, u64)>,
    records: Vec<PathBuf>,
    /// What came of the leader whenever an op took it away (app runs with `[leader]`).
    failovers: Failovers,
    violations: u64,
    rss_kib: Vec<(f64, u64)>,
    anon_kib: Vec<u64>,
}

/// The `app-failover` events of a soak's runs: how often the leader was lost, and what came
/// of it (another pod led, the same pod came back, none led), with the time without a Ready
/// leader.
#[derive(Debug, Default)]
struct Failovers {
    /// Time without a leader, ms, of each failover (another pod leads).
    failover_ms: Vec<u64>,
    /// ... of each loss the operator ended by bringing the same pod back as leader.
    kept_ms: Vec<u64>,
    /// Losses after which no pod led within the op's bound.
    no_leader: u64,
}

impl Tally {
    /// Counts one seed: its line, the kinds of the ops it ran, and its run's `app-failover`
    /// events (read from the run directory's event log).
    pub fn add(&mut self, line: &SeedLine, ran: impl IntoIterator<Item = OpKind>) {
        self.seeds += 1;
        self.steps += line.steps as u64;
        for (defect, n) in &line.known_defects {
            let e = self.known.entry(defect.clone()).or_default();
            e.0 += n;
            e.1 += 1;
        }
        for kind in ran {
            *self.ops.entry(kind).or_default() += 1;
        }
        self.failovers.read_events(&line.run_dir.join("events.jsonl"));
        match line.failed() {
            Some(what) => {
                self.failed += 1;
                if line.violated() {
                    self.violations += 1;
                }
                *self.failures.entry(what.to_string()).or_default() += 1;
                self.records.extend(line.record.clone());
            }
            None if line.verdict == "PASS" => self.passed += 1,
            None => self.cut += 1,
        }
        self.rss_kib.push((line.elapsed_s, line.rss_kib));
        self.anon_kib.push(line.rss_anon_kib);
    }

    /// The summary's rows from the seeds on: steps, ops, failovers, failures, known defects,
    /// records.
    pub fn rows(&self) -> Vec<(String, String)> {
        let mut rows = vec![("steps".to_string(), self.steps.to_string())];
        let ops: Vec<String> = self.ops.iter().map(|(k, n)| format!("{k} {n}")).collect();
        rows.push(("ops by family".into(), if ops.is_empty() { "none".into() } else { ops.join(" · ") }));
        if let Some(row) = self.failovers.row() {
            rows.push(("leader lost".into(), row));
        }
        let fails: Vec<String> = self.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
        rows.push(("failures".into(), if fails.is_empty() { "none".into() } else { fails.join(" · ") }));
        if !self.known.is_empty() {
            let known: Vec<String> = self.known.iter().map(|(d, (n, seeds))| format!("{d} ×{n} in {seeds} seed(s)")).collect();
            rows.push(("known defects".into(), format!("{} (reported, not failures)", known.join(" · "))));
        }
        for (i, r) in self.records.iter().enumerate() {
            rows.push((if i == 0 { "seed records".into() } else { String::new() }, r.display().to_string()));
        }
        rows
    }

    /// The exit code of what the seeds came to (`interrupted`: the run was asked to stop).
    pub fn exit(&self, interrupted: bool) -> Exit {
        if interrupted {
            Exit::Interrupted
        } else if self.violations > 0 {
            Exit::Violation
        } else if self.failed > 0 {
            Exit::Liveness
        } else {
            Exit::Pass
        }
    }

    /// `(passed, failed, cut short)`.
    pub fn outcomes(&self) -> (u64, u64, u64) {
        (self.passed, self.failed, self.cut)
    }

    pub fn seeds(&self) -> u64 {
        self.seeds
    }
}

impl Failovers {
    fn add(&mut self, detail: &serde_json::Value) {
        match (detail["failover"].as_bool(), detail["without_leader_ms"].as_u64()) {
            (Some(true), Some(ms)) => self.failover_ms.push(ms),
            (Some(false), Some(ms)) => self.kept_ms.push(ms),
            _ => self.no_leader += 1,
        }
    }

    /// Tallies the `app-failover` events of one run's event log (absent or unreadable: none).
    fn read_events(&mut self, path: &std::path::Path) {
        let Ok(text) = std::fs::read_to_string(path) else { return };
        for v in text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
            if v["event"] == "target" && v["kind"] == "app-failover" {
                self.add(&v["detail"]);
            }
        }
    }

    /// The summary's row; `None` when no op took a leader away.
    fn row(&self) -> Option<String> {
        let n = self.failover_ms.len() + self.kept_ms.len() + self.no_leader as usize;
        if n == 0 {
            return None;
        }
        let times = |ms: &[u64]| {
            let mut v = ms.to_vec();
            v.sort_unstable();
            let median = v[v.len() / 2] as f64 / 1000.0;
            let max = v[v.len() - 1] as f64 / 1000.0;
            format!("median {median:.1} s, max {max:.1} s without a Ready leader")
        };
        let mut parts = vec![];
        if !self.failover_ms.is_empty() {
            parts.push(format!("{} failed over ({})", self.failover_ms.len(), times(&self.failover_ms)));
        }
        if !self.kept_ms.is_empty() {
            parts.push(format!("{} kept by the operator, the same pod back ({})", self.kept_ms.len(), times(&self.kept_ms)));
        }
        if self.no_leader > 0 {
            parts.push(format!("{} with no leader within the op's bound", self.no_leader));
        }
        Some(format!("{n} times: {}", parts.join(" · ")))
    }
}

/// This process's resident set size in KiB (0 when /proc cannot tell).
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// The anonymous part of the RSS (heap and stacks, not the binary's pages), KiB: what grows
/// when memory leaks.
pub fn rss_anon_kib() -> u64 {
    status_kib("RssAnon:")
}

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

pub async fn soak(args: SoakArgs, opts: &RunOpts, json_logs: bool, interrupt: &Interrupt) -> Result<Exit, Fatal> {
    // What every seed's run checks before it creates anything (binaries, a kubeconfig, the
    // profile's invariants) is checked once before the soak's own directory exists: a soak that
    // cannot start leaves nothing behind.
    crate::profiles::invariants(&args.profile)?;
    crate::targets::prepare(&args.spec, &opts.target, &args.profile)?;
    let soak_id = format!("soak-{}", new_run_id().trim_start_matches("sd-"));
    let dir = create_run_dir(&opts.runs_dir, &soak_id)?;
    let t0 = Instant::now();
    // Time up = a stop request: the seed running then finishes its current step and stops.
    let stop = interrupt.until(t0 + args.duration);
    let (first, part) = (args.first_seed, args.partition);
    let share = if part.is_whole() { String::new() } else { format!(" (partition {part} of base seed {first})") };
    progress_line(
        json_logs,
        &format!(
            "soak {soak_id} · {} · profile {} · for {} · seeds {}, {}, …{share} · runs in {}",
            args.spec.describe(),
            args.profile.name,
            humantime::format_duration(args.duration),
            part.seed(first, 0),
            part.seed(first, 1),
            dir.display()
        ),
    );
    let bar = if std::io::stderr().is_terminal() && !json_logs {
        let b = ProgressBar::new_spinner();
        b.set_style(ProgressStyle::with_template("{spinner} {elapsed_precise} {prefix} · {wide_msg}").expect("a valid template"));
        b.enable_steady_tick(PROGRESS_TICK);
        Some(b)
    } else {
        None
    };
    let say = |line: &str| match &bar {
        Some(b) => b.println(line),
        None => progress_line(json_logs, line),
    };
    let x = Exec {
        opts,
        json_logs,
        interrupt: &stop,
        runs_dir: &dir,
        record: true,
        verbose: false,
        bar: bar.clone(),
        skip_liveness: false,
        replaying: None,
    };
    let mut log = std::fs::File::create(dir.join("soak.jsonl"))
        .map_err(|e| Fatal::environment(format!("cannot write {}/soak.jsonl: {e}", dir.display())))?;
    let mut tally = Tally::default();
    let mut cases: Vec<Case> = Vec::new();
    tally.rss_kib.push((0.0, rss_kib()));
    tally.anon_kib.push(rss_anon_kib());
    // A seed that ends in an error after others ran (an application the last seed left broken
    // so that the next cannot start, an environment error): the soak stops, and still sums up
    // what ran.
    let mut stopped_by: Option<Fatal> = None;
    let why_stopped = loop {
        if interrupt.requested() {
            break "interrupted".to_string();
        }
        if stop.requested() {
            break "time is up".to_string();
        }
        if args.max_failures.is_some_and(|m| tally.failed >= m as u64) {
            break "--max-failures reached".to_string();
        }
        let seed = part.seed(first, tally.seeds);
        let plan = super::planned(seed, &args.profile);
        if let Some(b) = &bar {
            b.set_prefix(format!("seeds {} · steps {} · failures {} · seed {seed}", tally.seeds, tally.steps, tally.failed));
        }
        let r = match execute(&x, &args.spec, &args.profile, &plan).await {
            Ok(r) => r,
            Err(e) => {
                // A target refused at connect (a kubeconfig, an apiserver) before the first seed
                // ran: the soak's directory holds only its owner file and an empty log.
                if tally.seeds == 0 {
                    drop(log);
                    remove_if_holding_only(&dir, &["run.json", "soak.jsonl"]);
                    return Err(e);
                }
                say(&format!("seed {seed}: error (exit {}): {}", e.exit.code(), e.message));
                let why = format!("seed {seed} ended in an error, exit {}: {}", e.exit.code(), e.message);
                stopped_by = Some(e);
                break why;
            }
        };
        let ran = match &r.outcome {
            Ok(Outcome::Pass { steps }) => *steps,
            Ok(Outcome::Failed(f)) => f.step.min(plan.ops.len()),
            Ok(Outcome::Stopped { steps }) => *steps,
            Err(Interrupted) => 0,
        };
        let mut known_defects: BTreeMap<String, u64> = BTreeMap::new();
        for k in &r.known {
            *known_defects.entry(k.defect.clone()).or_default() += 1;
        }
        let verdict = match &r.outcome {
            Ok(Outcome::Pass { .. }) => "PASS".to_string(),
            Ok(Outcome::Failed(f)) => {
                let what = f.invariant.map(|i| i.to_string()).unwrap_or_else(|| "liveness".into());
                format!("FAIL {what} at step {}: {}", f.step, f.message)
            }
            Ok(Outcome::Stopped { .. }) | Err(Interrupted) => format!("cut short after {}", shakedown_faults::counted(ran as u64, "step")),
        };
        let elapsed = t0.elapsed().as_secs_f64();
        // A seed's histories (acknowledged writes, watch events) are freed when it ends; glibc
        // keeps the freed pages unless asked to give them back, which would read as growth.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free heap memory to the system.
        unsafe {
            libc::malloc_trim(0);
        }
        let line = SeedLine {
            seed,
            verdict,
            steps: ran,
            failure: r.outcome.as_ref().ok().and_then(|o| match o {
                Outcome::Failed(f) => Some(f.kind),
                _ => None,
            }),
            ms: r.elapsed.as_millis() as u64,
            run_dir: r.run_dir.clone(),
            record: r.record.clone(),
            known_defects,
            elapsed_s: elapsed,
            rss_kib: rss_kib(),
            rss_anon_kib: rss_anon_kib(),
        };
        tally.add(&line, plan.ops[..ran].iter().map(|op| op.kind()));
        let _ = writeln!(log, "{}", serde_json::to_string(&line).expect("a seed line serializes"));
        say(&format!(
            "seed {seed}: {} · {} · {:.1}s · {}",
            line.verdict,
            shakedown_faults::counted(ran as u64, "step"),
            r.elapsed.as_secs_f64(),
            r.run_dir.display()
        ));
        cases.push(case_of(&r));
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let summary = summary_rows(&args, &tally, &why_stopped, t0.elapsed(), &dir);
    let junit = report::junit(&format!("shakedown soak {}", args.profile.name), &cases);
    let html = report::html::soak_report(&SoakSummary {
        title: format!("shakedown soak {soak_id} · profile {}", args.profile.name),
        rows: summary.clone(),
        cases: cases.clone(),
        base: dir.clone(),
        rss_kib: tally.rss_kib.clone(),
    });
    if let Some(path) = &args.junit {
        super::write_junit_to(path, &junit)?;
    }
    for (file, body) in [("junit.xml", junit), ("report.html", html)] {
        std::fs::write(dir.join(file), body).map_err(|e| Fatal::environment(format!("cannot write {}/{file}: {e}", dir.display())))?;
    }
    println!("{}", table(&summary));
    match stopped_by {
        // What the seeds found comes first (a CI gate must see a violation); else why the soak
        // could not go on.
        Some(e) if tally.failed == 0 => Err(e),
        _ => Ok(tally.exit(interrupt.requested())),
    }
}

fn summary_rows(args: &SoakArgs, t: &Tally, why: &str, elapsed: Duration, dir: &std::path::Path) -> Vec<(String, String)> {
    let mut rows = vec![
        ("profile".to_string(), args.profile.name.clone()),
        ("ran for".to_string(), format!("{} ({why})", humantime::format_duration(Duration::from_secs(elapsed.as_secs())))),
        (
            "seeds".to_string(),
            match t.seeds {
                0 => "0".to_string(),
                n => {
                    let p = args.partition;
                    let step = if p.is_whole() { String::new() } else { format!(" every {} (partition {p})", p.of) };
                    format!(
                        "{n}: {} … {}{step} ({} passed, {} failed, {} cut short)",
                        p.seed(args.first_seed, 0),
                        p.seed(args.first_seed, n - 1),
                        t.passed,
                        t.failed,
                        t.cut
                    )
                }
            },
        ),
    ];
    rows.extend(t.rows());
    rows.push(("reports".into(), format!("{0}/report.html · {0}/junit.xml · {0}/soak.jsonl", dir.display())));
    let first = t.rss_kib.first().map_or(0, |r| r.1);
    let last = t.rss_kib.last().map_or(0, |r| r.1);
    let max = t.rss_kib.iter().map(|r| r.1).max().unwrap_or(0);
    let mib = |k: u64| k as f64 / 1024.0;
    let (a0, a1) = (t.anon_kib.first().copied().unwrap_or(0), t.anon_kib.last().copied().unwrap_or(0));
    rows.push((
        "memory (RSS)".into(),
        format!(
            "{:.1} MiB at start → {:.1} MiB at end (max {:.1} MiB); heap and stacks {:.1} → {:.1} MiB",
            mib(first),
            mib(last),
            mib(max),
            mib(a0),
            mib(a1)
        ),
    ));
    rows
}

fn table(rows: &[(String, String)]) -> String {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = String::from("soak summary\n");
    for (k, v) in rows {
        let _ = writeln!(s, "  {k:<w$}  {v}");
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary's `leader lost` row: failovers and kept leaders apart, each with its median
    /// and maximum time without a leader; none when no op took a leader away.
    #[test]
    fn failovers_are_summed_by_what_came_of_the_leader() {
        let mut f = Failovers::default();
        assert_eq!(f.row(), None);
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let ev = |failover: bool, ms: Option<u64>| {
            serde_json::json!({"v": 1, "ts_ms": 1, "event": "target", "kind": "app-failover",
                "detail": {"before": "pg-0", "after": ms.map(|_| "pg-1"), "failover": failover, "without_leader_ms": ms}})
            .to_string()
        };
        let lines = [ev(true, Some(1400)), ev(true, Some(2800)), ev(true, Some(1200)), ev(false, Some(3800)), ev(false, None)];
        let other = r#"{"v":1,"ts_ms":1,"event":"target","kind":"app-kill","detail":{}}"#;
        std::fs::write(&events, format!("{}\n{other}\nnot json\n", lines.join("\n"))).unwrap();
        f.read_events(&events);
        f.read_events(&dir.path().join("missing.jsonl"));
        assert_eq!(
            f.row().unwrap(),
            "5 times: 3 failed over (median 1.4 s, max 2.8 s without a Ready leader) · 1 kept by the operator, the same pod back (median 3.8 s, max 3.8 s without a Ready leader) · 1 with no leader within the op's bound"
        );
    }
}
