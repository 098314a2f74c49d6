//! `shakedown replay FILE | DIR`: re-execute recorded plans exactly; a directory is a regression
//! corpus, each record checked against its `expect`. With `--times N` the reproduction rate and
//! its 95% interval; `--write-rate` keeps it in the record (`[[reproduction]]`), and a corpus
//! replay gives a record with a rate below 1 enough runs to make a miss unlikely.

use std::collections::BTreeMap;
use std::path::Path;

use crate::clock::now_rfc3339;
use crate::engine::Outcome;
use crate::exit::{Exit, Fatal};
use crate::rate;
use crate::record::{Expect, Match, Reproduction, SeedRecord};
use crate::targets::TargetSpec;

use super::session::{describe, execute, exit_for, Exec, Interrupted};

/// What `replay` was asked.
pub struct ReplayArgs {
    pub times: u32,
    pub original: bool,
    /// `--match`; `None`: the record's own `match`, else [`Match::Step`].
    pub matching: Option<Match>,
    /// Append the measured rate to the record (one record only).
    pub write_rate: bool,
}

/// How many replays one record gets.
struct Runs {
    max: u32,
    /// Stop at the first replay that reproduces (a timing-bound record in a corpus).
    stop_at_first: bool,
}

/// What the replays of one record showed.
struct Tally {
    runs: u32,
    reproduced: u32,
    matching: Match,
    /// The component versions they ran with.
    versions: BTreeMap<String, String>,
}

/// Replays one record `--times` times and reports the rate; with `--write-rate` appends it to
/// the record. Returns the exit code of the outcome.
pub async fn replay(file: &Path, args: &ReplayArgs, x: &Exec<'_>) -> Result<Exit, Fatal> {
    let record = SeedRecord::load(file)?;
    let matching = args.matching.or(record.matching).unwrap_or_default();
    let runs = Runs { max: args.times, stop_at_first: false };
    let (exit, tally) = replay_record(file, &record, &runs, args.original, matching, x).await?;
    match tally {
        Some(t) if args.write_rate => write_rate(file, &t, args.original)?,
        None if args.write_rate => println!("no rate written: the replays were interrupted"),
        _ => {}
    }
    Ok(exit)
}

/// Appends a measurement to the record at `file`, atomically. The record is read again first,
/// so what changed in it while the replays ran (another measurement, a shrink) is kept.
fn write_rate(file: &Path, t: &Tally, original: bool) -> Result<(), Fatal> {
    let mut record = SeedRecord::load(file)?;
    let entry = Reproduction {
        runs: t.runs,
        reproduced: t.reproduced,
        matched: t.matching,
        plan: record.which_plan(original),
        versions: t.versions.clone(),
        at: now_rfc3339(),
    };
    record.reproduction.push(entry);
    // A rate counted at any step (or by defect) means something only when the corpus counts
    // the same way.
    let noted_match = t.matching != Match::Step && record.matching.is_none();
    if noted_match {
        record.matching = Some(t.matching);
    }
    record.rewrite(file).map_err(|e| Fatal::environment(format!("cannot rewrite {}: {e}", file.display())))?;
    let versions: Vec<String> = t.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "rate written into {} ([[reproduction]] {} of {}, match {}, {}; {} measurement{} in the record)",
        file.display(),
        t.reproduced,
        t.runs,
        t.matching.name(),
        if versions.is_empty() { "versions unknown".to_string() } else { versions.join(", ") },
        record.reproduction.len(),
        if record.reproduction.len() == 1 { "" } else { "s" },
    );
    if noted_match {
        match t.matching {
            Match::Defect => println!("the record now counts a replay whose verdict names the same known defect (match = \"defect\")"),
            _ => println!("the record now counts a replay failing the same way at any step (match = \"invariant\")"),
        }
    }
    Ok(())
}

/// Replays `record` up to `runs.max` times. The tally is `None` when interrupted.
async fn replay_record(
    file: &Path,
    record: &SeedRecord,
    runs: &Runs,
    original: bool,
    matching: Match,
    x: &Exec<'_>,
) -> Result<(Exit, Option<Tally>), Fatal> {
    let spec = TargetSpec::from_options(record.target.kind(), &x.opts.target, Some(&record.target))?;
    let (plan, expected) = record.to_replay(original);
    let which = match (&record.shrunk, original) {
        (Some(_), false) => format!("shrunk plan, {} of {} ops (--original for all)", plan.ops.len(), record.plan.ops.len()),
        _ => format!("{} ops", plan.ops.len()),
    };
    let counted = match matching {
        Match::Step => "counted at the same step",
        Match::Invariant => "counted at any step (match invariant)",
        Match::Defect => "counted when any check names the same known defect (match defect)",
    };
    println!("replaying {} · seed {} · {which} · recorded: {} · {counted}", file.display(), record.seed, describe(expected));
    let times = runs.max;
    let mut tally = Tally { runs: 0, reproduced: 0, matching, versions: BTreeMap::new() };
    let mut exit = Exit::Pass;
    let x = &Exec { replaying: Some(file), bar: x.bar.clone(), ..*x };
    for i in 1..=times {
        let r = execute(x, &spec, &record.profile, &plan).await?;
        let verdict = match &r.outcome {
            Err(Interrupted) | Ok(Outcome::Stopped { .. }) => {
                println!("interrupted after {} of {times} replays", i - 1);
                return Ok((Exit::Interrupted, None));
            }
            Ok(Outcome::Pass { .. }) => "did not reproduce: every invariant held".to_string(),
            Ok(Outcome::Failed(f)) => {
                exit = exit_for(f);
                if matching.matches(expected, f) {
                    tally.reproduced += 1;
                    format!("reproduced: {}", describe(f))
                } else {
                    format!("failed differently: {}", describe(f))
                }
            }
        };
        tally.runs = i;
        if !r.versions.is_empty() {
            tally.versions = r.versions.clone();
        }
        println!("replay {i}/{times}: {verdict} (run directory {})", r.run_dir.display());
        if runs.stop_at_first && tally.reproduced > 0 {
            break;
        }
    }
    if runs.stop_at_first {
        // Stopping at the first reproduction biases the count: no interval.
        println!("reproduced {} of {} (stopped at the first reproduction; at most {times})", tally.reproduced, tally.runs);
    } else {
        println!("reproduced {}", rate::describe(tally.reproduced, tally.runs));
    }
    Ok((exit, Some(tally)))
}

/// Replays every record of a corpus directory against its expectation. Every record is checked
/// before anything runs. A record expected to fail whose measured rate is below 1 is
/// timing-bound: it gets up to [`rate::runs_to_catch`] replays (at least `--times`, at most
/// [`rate::MAX_RUNS`]) and passes at the first that reproduces.
pub async fn replay_corpus(dir: &Path, args: &ReplayArgs, x: &Exec<'_>) -> Result<Exit, Fatal> {
    let records = SeedRecord::load_dir(dir)?;
    let mut mismatched = Vec::new();
    for (path, record) in &records {
        let matching = args.matching.or(record.matching).unwrap_or_default();
        let rate = match record.expect {
            Expect::Fail => record.planning_rate(matching, record.which_plan(args.original)).filter(|p| *p < 1.0),
            Expect::Pass => None,
        };
        let runs = match rate {
            Some(p) => {
                let max = rate::runs_to_catch(p, args.times, rate::MAX_RUNS);
                println!(
                    "{}: timing-bound (reproduced in {:.0}% of replays when measured, match {}): up to {max} replays, until one reproduces",
                    path.display(),
                    100.0 * p,
                    matching.name()
                );
                Runs { max, stop_at_first: true }
            }
            None => Runs { max: args.times, stop_at_first: false },
        };
        let (exit, tally) = replay_record(path, record, &runs, args.original, matching, x).await?;
        let Some(tally) = tally else { return Ok(Exit::Interrupted) };
        let as_expected = match record.expect {
            Expect::Fail => tally.reproduced > 0,
            Expect::Pass => exit == Exit::Pass,
        };
        let expect = format!("{:?}", record.expect).to_lowercase();
        println!("{}: expect {expect}: {}", path.display(), if as_expected { "as expected" } else { "MISMATCH" });
        if !as_expected {
            mismatched.push(path.display().to_string());
        }
    }
    println!(
        "corpus {}: {} records, {} as expected, {} mismatched",
        dir.display(),
        records.len(),
        records.len() - mismatched.len(),
        mismatched.len()
    );
    for m in &mismatched {
        println!("mismatch: {m}");
    }
    Ok(if mismatched.is_empty() { Exit::Pass } else { Exit::Violation })
}
