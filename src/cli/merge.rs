//! `shakedown merge SOAK_DIR...`: the results of many soaks (a soak farm's pods, each with its
//! share of the seeds, or a week of nightly soaks) as one: a summary table, one JUnit file with
//! a case per seed, and one HTML index linking every seed's report. Read from what each soak
//! left in its directory (`soak.jsonl`, and each run's `plan.toml` and event log); nothing is
//! run again.

use std::path::{Path, PathBuf};

use crate::exit::{Exit, Fatal};
use crate::faults::Plan;
use crate::report::{self, html::SoakSummary, Case};

use super::soak::{SeedLine, Tally};

/// One soak directory read back.
struct Soak {
    dir: PathBuf,
    lines: Vec<SeedLine>,
}

/// Reads `dir/soak.jsonl`. A directory without one is not a soak's (exit 2); a line that does
/// not parse (a soak killed while writing it) is skipped with a warning.
fn read_soak(dir: &Path) -> Result<Soak, Fatal> {
    let file = dir.join("soak.jsonl");
    let text = std::fs::read_to_string(&file)
        .map_err(|e| Fatal::usage(format!("{} is not a soak directory: cannot read {}: {e}", dir.display(), file.display())))?;
    let mut lines = vec![];
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<SeedLine>(l) {
            Ok(mut line) => {
                // A soak directory moved (copied off a claim, say): its runs are beside the log.
                if !line.run_dir.exists() {
                    if let Some(name) = line.run_dir.file_name() {
                        line.run_dir = dir.join(name);
                    }
                }
                lines.push(line)
            }
            Err(e) => tracing::warn!("{}:{}: skipped, not a seed's line: {e}", file.display(), i + 1),
        }
    }
    Ok(Soak { dir: dir.to_path_buf(), lines })
}

/// How deep below a directory given to `merge` its soaks are looked for: a soak farm's claim
/// holds `farm/pod-<i>/soak-<id>/` (no shell in the image to expand a glob).
const SEARCH_DEPTH: usize = 3;

/// The soak directories `dirs` name: each one holding a `soak.jsonl`, or, for one that does
/// not, every directory below it (up to [`SEARCH_DEPTH`] levels, in name order) that does. A
/// directory with neither is a usage error (exit 2), as is one that cannot be read.
fn soak_dirs(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, Fatal> {
    fn below(d: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        if d.join("soak.jsonl").is_file() {
            out.push(d.to_path_buf());
            return;
        }
        if depth == 0 {
            return;
        }
        let Ok(rd) = std::fs::read_dir(d) else { return };
        let mut subs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        subs.sort();
        for s in subs {
            below(&s, depth - 1, out);
        }
    }
    let mut out = vec![];
    for d in dirs {
        if !d.is_dir() {
            return Err(Fatal::usage(format!(
                "{} is not a directory: give soak directories (shakedown-runs/soak-*) or a directory holding them",
                d.display()
            )));
        }
        let before = out.len();
        below(d, SEARCH_DEPTH, &mut out);
        if out.len() == before {
            return Err(Fatal::usage(format!(
                "{} is not a soak directory and holds none (no soak.jsonl in it or up to {SEARCH_DEPTH} levels below)",
                d.display()
            )));
        }
    }
    out.dedup();
    Ok(out)
}

/// The plan a seed ran (`None` when its run directory is gone).
fn plan_of(line: &SeedLine) -> Option<Plan> {
    toml::from_str(&std::fs::read_to_string(line.run_dir.join("plan.toml")).ok()?).ok()
}

/// Merges the soaks in `dirs` into `out` (`report.html`, `junit.xml`; `--junit PATH` as well):
/// prints the summary; the exit code is what the seeds came to, as a soak's.
pub fn merge(dirs: &[PathBuf], out: &Path, junit: Option<&Path>) -> Result<Exit, Fatal> {
    if dirs.is_empty() {
        return Err(Fatal::usage("merge needs at least one soak directory"));
    }
    let dirs = soak_dirs(dirs)?;
    let soaks = dirs.iter().map(|d| read_soak(d)).collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(out).map_err(|e| Fatal::usage(format!("cannot create {}: {e}", out.display())))?;
    let mut tally = Tally::default();
    let mut cases: Vec<Case> = vec![];
    let mut profiles = std::collections::BTreeSet::new();
    let mut missing = 0;
    for soak in &soaks {
        let name = soak.dir.file_name().map_or_else(|| soak.dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        for line in &soak.lines {
            let plan = plan_of(line);
            missing += usize::from(plan.is_none());
            let profile = plan.as_ref().map_or_else(|| "unknown".to_string(), |p| p.profile.clone());
            let ran = plan.map(|p| p.ops.iter().take(line.steps).map(|op| op.kind()).collect::<Vec<_>>()).unwrap_or_default();
            tally.add(line, ran);
            cases.push(line.case(&format!("shakedown.{profile}.{name}")));
            profiles.insert(profile);
        }
    }
    let (passed, failed, cut) = tally.outcomes();
    let mut rows = vec![
        ("soaks".to_string(), format!("{}: {}", soaks.len(), dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "))),
        ("profiles".to_string(), profiles.into_iter().collect::<Vec<_>>().join(", ")),
        ("seeds".to_string(), format!("{} ({passed} passed, {failed} failed, {cut} cut short)", tally.seeds())),
    ];
    rows.extend(tally.rows());
    if missing > 0 {
        rows.push(("not counted".into(), format!("the ops of {missing} seed(s) whose run directory is gone")));
    }
    let mib = |k: u64| k as f64 / 1024.0;
    let peaks: Vec<String> = soaks.iter().map(|s| format!("{:.1}", mib(s.lines.iter().map(|l| l.rss_kib).max().unwrap_or(0)))).collect();
    rows.push(("memory (RSS)".into(), format!("peak per soak: {} MiB", peaks.join(", "))));
    rows.push(("reports".into(), format!("{0}/report.html · {0}/junit.xml", out.display())));
    let junit_xml = report::junit("shakedown merged soaks", &cases);
    let html = report::html::soak_report(&SoakSummary {
        title: format!("shakedown: {} soaks merged", soaks.len()),
        rows: rows.clone(),
        cases,
        base: out.to_path_buf(),
        // Each soak's clock starts at its own 0: no one memory curve (the peaks are a row).
        rss_kib: vec![],
    });
    if let Some(path) = junit {
        super::write_junit_to(path, &junit_xml)?;
    }
    for (file, body) in [("junit.xml", junit_xml), ("report.html", html)] {
        std::fs::write(out.join(file), body).map_err(|e| Fatal::environment(format!("cannot write {}/{file}: {e}", out.display())))?;
    }
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("merged soaks");
    for (k, v) in &rows {
        println!("  {k:<w$}  {v}");
    }
    Ok(tally.exit(false))
}
