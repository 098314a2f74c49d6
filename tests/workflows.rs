//! The three jobs on the real local stack: shrinking a failing seed, soaking, and the reports
//! they leave (JUnit XML, HTML, forensics). Needs root and what `.ci/run` installs.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{dirs, leftovers, run, seed_records, text};
use shakedown::faults::{generate, Op};
use shakedown::record::SeedRecord;

static STACK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    STACK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses an XML file with Python's XML parser (a real parser, not a string match) and returns
/// (tests, failures, skipped) of its first test suite and every failure message.
fn junit_counts(path: &Path) -> (u32, u32, u32, Vec<String>) {
    let script = r#"
import sys, xml.etree.ElementTree as E
s = E.parse(sys.argv[1]).getroot().find('testsuite')
print(s.get('tests'), s.get('failures'), s.get('skipped'))
for f in s.iter('failure'):
    print(f.get('message'))
"#;
    let out = std::process::Command::new("python3").arg("-c").arg(script).arg(path).output().expect("python3 runs");
    assert!(out.status.success(), "{} is not valid XML: {}", path.display(), text(&out.stderr));
    let s = text(&out.stdout);
    let mut lines = s.lines();
    let counts: Vec<u32> = lines.next().unwrap().split_whitespace().map(|n| n.parse().unwrap()).collect();
    (counts[0], counts[1], counts[2], lines.map(str::to_string).collect())
}

/// Starts a shakedown command; returns the child and a receiver of its stdout lines.
fn spawn(args: &[&str], d: &common::Dirs) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = common::bin()
        .args(args)
        .arg("--runs-dir")
        .arg(&d.runs)
        .arg("--seeds-dir")
        .arg(&d.seeds)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            eprintln!("| {line}");
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

fn wait_line(rx: &std::sync::mpsc::Receiver<String>, needle: &str, limit: Duration) -> Vec<String> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < limit {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            let hit = l.contains(needle);
            seen.push(l);
            if hit {
                return seen;
            }
        }
    }
    panic!("no line containing {needle:?} within {limit:?}; saw {seen:?}");
}

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        assert!(t0.elapsed() < limit, "did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A 30-step smoke plan (cheap ops: this runs in CI) in which the first restore (the trigger of
/// `restore-partial`) comes late, so there is plenty to shrink away.
fn seed_with_late_restore() -> u64 {
    let mut profile = shakedown::profiles::load("smoke").unwrap();
    profile.steps = 30;
    (1..20_000u64)
        .find(|&s| generate(s, &profile).ops.iter().position(|o| matches!(o, Op::Restore { .. })).is_some_and(|i| (15..25).contains(&i)))
        .expect("a seed with a late restore")
}

#[test]
fn a_planted_bug_failure_shrinks_to_a_handful_of_steps_and_the_shrunk_record_replays() {
    let _l = lock();
    let d = dirs();
    let seed = seed_with_late_restore().to_string();
    let out = run(&["run", "--seed", &seed, "--steps", "30", "--profile", "smoke", "--testbed-bug", "restore-partial"], &d);
    assert_eq!(out.status.code(), Some(1), "restore-partial is caught");
    let file = seed_records(&d.seeds).pop().unwrap();
    let f = file.to_str().unwrap();
    let original = SeedRecord::load(&file).unwrap();
    assert!(original.failure.step >= 15, "{:?}", original.failure);
    assert!(original.duration_ms.is_some());

    // Interrupted half-way: the original plan and failure are untouched; what was found so far
    // is kept, marked incomplete.
    let (mut child, rx) = spawn(&["shrink", f], &d);
    wait_line(&rx, "run   1 ·", Duration::from_secs(120));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut child, Duration::from_secs(60)), 130);
    let after = SeedRecord::load(&file).expect("the record still loads after an interrupted shrink");
    assert_eq!((&after.plan, &after.failure), (&original.plan, &original.failure));
    assert!(after.shrunk.as_ref().is_none_or(|s| !s.complete), "{:?}", after.shrunk);
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());

    // Shrinking again goes on from there, to a handful of steps.
    let out = run(&["shrink", f, "--max-runs", "40"], &d);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("shrunk 30 → "), "{stdout}");
    let shrunk = SeedRecord::load(&file).unwrap();
    let s = shrunk.shrunk.as_ref().expect("a shrunk plan");
    assert!(s.ops.len() <= 4, "shrunk to {} ops: {:?}", s.ops.len(), s.ops);
    assert!(s.ops.iter().any(|o| matches!(o, Op::Restore { .. })), "the trigger stays: {:?}", s.ops);
    assert_eq!(s.failure.invariant, original.failure.invariant);
    assert_eq!(shrunk.plan, original.plan, "the original plan stays beside the shrunk one");
    assert_eq!(stdout.lines().last().unwrap(), format!("shakedown replay {f}"));

    // replay runs the shrunk plan; --original the recorded one.
    let out = run(&["replay", f], &d);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("shrunk plan, {} of 30 ops", s.ops.len())) && stdout.contains("reproduced 1 of 1"), "{stdout}");
    let out = run(&["replay", f, "--original"], &d);
    assert!(text(&out.stdout).contains("· 30 ops ·") && text(&out.stdout).contains("reproduced 1 of 1"), "{}", text(&out.stdout));
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());
}

fn soak_dir(runs: &Path) -> PathBuf {
    std::fs::read_dir(runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("soak-"))
        .expect("a soak directory")
}

#[test]
fn soak_records_every_failure_and_writes_summary_junit_and_html() {
    let _l = lock();
    let d = dirs();
    // ack-before-write loses acknowledged writes: every seed fails, at the bring-up check.
    let out =
        run(&["soak", "--for", "2m", "--profile", "smoke", "--seed", "40", "--max-failures", "2", "--testbed-bug", "ack-before-write"], &d);
    assert_eq!(out.status.code(), Some(1), "violations exit 1");
    let stdout = text(&out.stdout);
    assert!(stdout.contains("soak summary") && stdout.contains("--max-failures reached"), "{stdout}");
    assert!(stdout.contains("seeds          2: 40 … 41 (0 passed, 2 failed, 0 cut short)"), "{stdout}");
    assert!(stdout.contains("failures       durability 2"), "{stdout}");
    let records = seed_records(&d.seeds);
    assert_eq!(records.len(), 2);
    let dir = soak_dir(&d.runs);
    let (tests, failures, _, messages) = junit_counts(&dir.join("junit.xml"));
    assert_eq!((tests, failures), (2, 2));
    for r in &records {
        let replay = format!("replay: shakedown replay {}", r.display());
        assert!(messages.iter().any(|m| m.ends_with(&replay)), "no failure message ends with {replay:?}: {messages:?}");
    }
    let index = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(index.contains("seed 40") && index.contains("seed 41") && index.contains("/report.html\">report</a>"), "{index}");
    assert_eq!(std::fs::read_to_string(dir.join("soak.jsonl")).unwrap().lines().count(), 2);
    // Each run has its own report (with the plot) and forensics.
    for run_dir in std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        let html = std::fs::read_to_string(run_dir.join("report.html")).unwrap();
        assert!(html.contains("<svg") && html.contains("FAIL"), "{}", run_dir.display());
        assert!(run_dir.join("forensics/observation.json").is_file() && run_dir.join("forensics/m0.log.tail").is_file());
        let (t, f, _, _) = junit_counts(&run_dir.join("junit.xml"));
        assert_eq!((t, f), (1, 1));
    }
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());
}

#[test]
fn soak_passes_the_smoke_tier_and_ctrl_c_stops_it_cleanly_with_a_summary() {
    let _l = lock();
    let d = dirs();
    let out = run(&["soak", "--for", "20s", "--profile", "smoke", "--seed", "7"], &d);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("(time is up)") && stdout.contains("failures       none"), "{stdout}");
    let (tests, failures, _, _) = junit_counts(&soak_dir(&d.runs).join("junit.xml"));
    assert!(tests >= 1 && failures == 0);
    assert!(seed_records(&d.seeds).is_empty());
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());

    let d = dirs();
    let (mut child, rx) = spawn(&["soak", "--for", "10m", "--profile", "smoke", "--seed", "70"], &d);
    // Wait until a stack is up (a run directory with a running etcd).
    let t0 = Instant::now();
    while !leftovers(&d.runs).iter().any(|l| l.contains("etcd")) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the soak started a stack");
        std::thread::sleep(Duration::from_millis(100));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut child, Duration::from_secs(60)), 130);
    let lines: Vec<String> = rx.try_iter().collect();
    assert!(lines.iter().any(|l| l.contains("ran for") && l.contains("(interrupted)")), "{lines:?}");
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());
}

/// The corpus shipped in `seeds/` (planted bugs kept to show detection, and plans that once
/// raised false alarms, kept as `expect = "pass"`) replays as each record expects.
#[test]
fn the_shipped_regression_corpus_replays_as_expected() {
    let _l = lock();
    let d = dirs();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let records = seed_records(&corpus);
    assert!(records.len() >= 3, "{records:?}");
    let out = run(&["replay", corpus.to_str().unwrap()], &d);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains(&format!("{} records, {} as expected, 0 mismatched", records.len(), records.len())), "{stdout}");
    assert!(seed_records(&d.seeds).is_empty(), "replaying writes no record");
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());
}

/// Issue 12: `--write-rate` appends the measured rate to the record (atomically, keeping what
/// was there); a corpus replays a record with a rate below 1 until the first reproduction.
#[test]
fn replay_writes_the_rate_into_the_record_and_a_timing_bound_record_stops_at_the_first_reproduction() {
    use shakedown::record::{Match, WhichPlan};
    let _l = lock();
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/seed-1-durability-ack-before-write.toml");
    let file = d.seeds.join("seed-1.toml");
    std::fs::copy(&shipped, &file).unwrap();
    let f = file.to_str().unwrap();
    let before = SeedRecord::load(&file).unwrap();
    assert!(before.reproduction.is_empty());

    let out = run(&["replay", f, "--times", "2", "--write-rate"], &d);
    assert_eq!(out.status.code(), Some(1), "ack-before-write is caught");
    let stdout = text(&out.stdout);
    assert!(stdout.contains("reproduced 2 of 2 (100%), 95% interval 34–100%"), "{stdout}");
    assert!(stdout.contains("rate written into"), "{stdout}");
    let after = SeedRecord::load(&file).unwrap();
    assert_eq!(after.reproduction.len(), 1, "{:?}", after.reproduction);
    let m = &after.reproduction[0];
    assert_eq!((m.runs, m.reproduced, m.matched, m.plan), (2, 2, Match::Step, WhichPlan::Shrunk));
    assert!(
        m.versions.contains_key("etcd-3.5") && m.versions.contains_key("etcd-3.4"),
        "the versions the replays ran with: {:?}",
        m.versions
    );
    assert_eq!(
        (&after.plan, &after.failure, &after.shrunk, after.matching),
        (&before.plan, &before.failure, &before.shrunk, None),
        "the rest is kept"
    );
    assert!(std::fs::read_to_string(&file).unwrap().contains("[[reproduction]]"));

    // A second measurement is appended; counted at any step, it sets the record's match.
    let out = run(&["replay", f, "--match", "invariant", "--write-rate"], &d);
    assert_eq!(out.status.code(), Some(1));
    let after = SeedRecord::load(&file).unwrap();
    assert_eq!(after.reproduction.len(), 2);
    assert_eq!(after.reproduction[0], m.clone(), "older measurements stay");
    assert_eq!((after.reproduction[1].runs, after.reproduction[1].matched), (1, Match::Invariant));
    assert_eq!(after.matching, Some(Match::Invariant));
    assert!(seed_records(&d.seeds).len() == 1, "replaying writes no new record (and leaves no temp file)");

    // In a corpus, a rate below 1 makes the record timing-bound: up to 5 replays at 1 of 2,
    // stopping at the first that reproduces.
    let mut rated = after.clone();
    rated.reproduction[1].reproduced = 1;
    rated.reproduction[1].runs = 2;
    let corpus = d.runs.parent().unwrap().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    rated.rewrite(&corpus.join("seed-1.toml")).unwrap();
    let out = run(&["replay", corpus.to_str().unwrap()], &d);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("timing-bound (reproduced in 50% of replays when measured, match invariant): up to 5 replays"), "{stdout}");
    assert!(stdout.contains("replay 1/5: reproduced") && !stdout.contains("replay 2/5"), "{stdout}");
    assert!(stdout.contains("1 records, 1 as expected, 0 mismatched"), "{stdout}");
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());
}
