//! `shakedown replay FILE | DIR`: re-execute recorded plans exactly; a directory is a regression
//! corpus, each record checked against its `expect`.

use std::path::Path;

use shakedown::exit::{Exit, Fatal};
use shakedown::record::{Expect, SeedRecord};
use shakedown::engine::Outcome;
use shakedown::targets::TargetSpec;

use super::session::{describe, execute, exit_for, Exec, Interrupted};

/// Replays one record `times` times; returns the exit code of the outcome and how many runs
/// reproduced the recorded failure (`None` when interrupted).
pub async fn replay(file: &Path, times: u32, original: bool, x: &Exec<'_>) -> Result<(Exit, Option<u32>), Fatal> {
    let record = SeedRecord::load(file)?;
    replay_record(file, &record, times, original, x).await
}

async fn replay_record(file: &Path, record: &SeedRecord, times: u32, original: bool, x: &Exec<'_>) -> Result<(Exit, Option<u32>), Fatal> {
    let spec = TargetSpec::from_options(record.target.kind(), &x.opts.target, Some(&record.target))?;
    let (plan, expected) = record.to_replay(original);
    let which = match (&record.shrunk, original) {
        (Some(_), false) => format!("shrunk plan, {} of {} ops (--original for all)", plan.ops.len(), record.plan.ops.len()),
        _ => format!("{} ops", plan.ops.len()),
    };
    println!("replaying {} · seed {} · {which} · recorded: {}", file.display(), record.seed, describe(expected));
    let mut reproduced = 0;
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
                if f.kind == expected.kind && f.step == expected.step && f.invariant == expected.invariant {
                    reproduced += 1;
                    format!("reproduced: {}", describe(f))
                } else {
                    format!("failed differently: {}", describe(f))
                }
            }
        };
        println!("replay {i}/{times}: {verdict} (run directory {})", r.run_dir.display());
    }
    println!("reproduced {reproduced} of {times} ({:.0}%)", 100.0 * reproduced as f64 / times as f64);
    Ok((exit, Some(reproduced)))
}

/// Replays every record of a corpus directory against its expectation. Every record is checked
/// before anything runs.
pub async fn replay_corpus(dir: &Path, times: u32, original: bool, x: &Exec<'_>) -> Result<Exit, Fatal> {
    let records = SeedRecord::load_dir(dir)?;
    let mut mismatched = Vec::new();
    for (path, record) in &records {
        let (exit, reproduced) = replay_record(path, record, times, original, x).await?;
        let Some(reproduced) = reproduced else { return Ok(Exit::Interrupted) };
        let as_expected = match record.expect {
            Expect::Fail => reproduced > 0,
            Expect::Pass => exit == Exit::Pass,
        };
        let expect = format!("{:?}", record.expect).to_lowercase();
        println!("{}: expect {expect}: {}", path.display(), if as_expected { "as expected" } else { "MISMATCH" });
        if !as_expected {
            mismatched.push(path.display().to_string());
        }
    }
    println!("corpus {}: {} records, {} as expected, {} mismatched", dir.display(), records.len(), records.len() - mismatched.len(), mismatched.len());
    for m in &mismatched {
        println!("mismatch: {m}");
    }
    Ok(if mismatched.is_empty() { Exit::Pass } else { Exit::Violation })
}
