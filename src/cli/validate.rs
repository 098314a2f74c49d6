//! `shakedown validate`: profiles, kube profiles, app profiles and seed records checked offline
//! (no cluster, no stack, no network, nothing created) by the very loaders a run, a replay or a
//! shrink calls before it creates anything. One line per input: `ok: …` with a summary, or the
//! loader's error (with its line and column where it has them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::exit::{Exit, Fatal};
use crate::faults::{OpKind, Profile};
use crate::profiles;
use crate::record::SeedRecord;
use crate::targets::app::spec::AppProfile;
use crate::targets::kube::profile::KubeProfile;
use crate::targets::{stack_fits, TargetKind, TargetOptions, TargetSpec};

/// What an input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Profile,
    KubeProfile,
    AppProfile,
    Record,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Profile => "profile",
            Kind::KubeProfile => "kube profile",
            Kind::AppProfile => "app profile",
            Kind::Record => "seed record",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Kind::Profile => "--profile",
            Kind::KubeProfile => "--kube-profile",
            Kind::AppProfile => "--app-profile",
            Kind::Record => "--record",
        }
    }
}

/// The inputs of one `validate`: files whose kind is recognised, and files named by kind.
#[derive(Debug, Default)]
pub struct Inputs {
    pub files: Vec<PathBuf>,
    pub profiles: Vec<String>,
    pub kube_profiles: Vec<PathBuf>,
    pub app_profiles: Vec<PathBuf>,
    pub records: Vec<PathBuf>,
}

/// Checks every input and prints one line for each; exit 0 when all are valid, else a usage
/// error (exit 2) counting those that are not.
pub fn validate(inputs: &Inputs) -> Result<Exit, Fatal> {
    let mut checks: Vec<(String, Result<String, String>)> = Vec::new();
    for f in &inputs.files {
        if f.is_dir() {
            match toml_files(f) {
                Ok(files) => checks.extend(files.iter().map(|p| (p.display().to_string(), detect(p).and_then(|k| check(k, p))))),
                Err(e) => checks.push((f.display().to_string(), Err(e))),
            }
        } else if !f.exists() && f.to_str().is_some_and(|n| profiles::BUILTIN.iter().any(|(b, _)| *b == n)) {
            // A shipped profile's name (`shakedown validate nightly`).
            checks.push((f.display().to_string(), check(Kind::Profile, f)));
        } else {
            checks.push((f.display().to_string(), detect(f).and_then(|k| check(k, f))));
        }
    }
    let named = inputs
        .profiles
        .iter()
        .map(|p| (Kind::Profile, PathBuf::from(p)))
        .chain(inputs.kube_profiles.iter().map(|p| (Kind::KubeProfile, p.clone())))
        .chain(inputs.app_profiles.iter().map(|p| (Kind::AppProfile, p.clone())))
        .chain(inputs.records.iter().map(|p| (Kind::Record, p.clone())));
    for (kind, p) in named {
        checks.push((p.display().to_string(), check(kind, &p)));
    }
    if checks.is_empty() {
        return Err(Fatal::usage(
            "nothing to validate: give files (or directories of them), or --profile, --kube-profile, --app-profile, --record",
        ));
    }
    let bad = checks.iter().filter(|(_, r)| r.is_err()).count();
    for (shown, r) in &checks {
        match r {
            Ok(summary) => println!("ok: {shown}: {summary}"),
            Err(e) => eprintln!("error: {shown}: {e}"),
        }
    }
    match bad {
        0 => Ok(Exit::Pass),
        _ => Err(Fatal::usage(format!("{bad} of {} input{} not valid", checks.len(), if checks.len() == 1 { " is" } else { "s are" }))),
    }
}

/// The `*.toml` files of a directory, sorted (as `replay DIR` reads a corpus).
fn toml_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read the directory: {e}"))?;
    let mut files: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml")).collect();
    files.sort();
    if files.is_empty() {
        return Err("the directory holds no *.toml files".into());
    }
    Ok(files)
}

/// The top-level keys of a type's TOML form, from its schema (the fields `deny_unknown_fields`
/// admits).
fn keys_of<T: schemars::JsonSchema>() -> BTreeSet<String> {
    let schema = schemars::schema_for!(T).to_value();
    schema.get("properties").and_then(|p| p.as_object()).map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

/// The keys only a seed record has: any of them makes a file a record.
const RECORD_KEYS: [&str; 4] = ["format", "failure", "plan", "run_id"];

/// What a file is, by its top-level keys: a seed record when it has a record's own keys, else the
/// kind that knows most of its keys; a tie (or no key known) is refused, naming the flags that say.
fn detect(path: &Path) -> Result<Kind, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| format!("not TOML: {e}"))?;
    let keys: BTreeSet<&str> = table.keys().map(String::as_str).collect();
    if keys.iter().any(|k| RECORD_KEYS.contains(k)) {
        return Ok(Kind::Record);
    }
    let scored: Vec<(Kind, usize)> =
        [(Kind::Profile, keys_of::<Profile>()), (Kind::KubeProfile, keys_of::<KubeProfile>()), (Kind::AppProfile, keys_of::<AppProfile>())]
            .into_iter()
            .map(|(kind, known)| (kind, keys.iter().filter(|k| known.contains(**k)).count()))
            .collect();
    let best = scored.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let tied: Vec<Kind> = scored.iter().filter(|(_, n)| *n == best).map(|(k, _)| *k).collect();
    let say = "say which with --profile, --kube-profile, --app-profile or --record FILE";
    let listed = keys.iter().copied().collect::<Vec<_>>().join(", ");
    match tied.as_slice() {
        [kind] if best > 0 => Ok(*kind),
        _ if best == 0 => Err(format!(
            "cannot tell what it is: {} is a field of no profile, kube profile, app profile or seed record; {say}",
            if keys.is_empty() { "it is empty, and nothing".to_string() } else { format!("none of its keys ({listed})") }
        )),
        kinds => Err(format!(
            "cannot tell what it is: its keys ({listed}) fit {} equally; {}",
            kinds.iter().map(|k| format!("a {}", k.name())).collect::<Vec<_>>().join(" and "),
            kinds.iter().map(|k| format!("{} {}", k.flag(), path.display())).collect::<Vec<_>>().join(" or ")
        )),
    }
}

/// Loads `input` as `kind` with the loader a run uses, and the checks it applies before it
/// creates anything: the summary, or the loader's error.
fn check(kind: Kind, input: &Path) -> Result<String, String> {
    match kind {
        Kind::Profile => {
            let name = input.to_str().ok_or("not a UTF-8 path")?;
            let p = profiles::load(name).map_err(|e| e.message)?;
            Ok(profile_summary(&p))
        }
        Kind::KubeProfile => {
            let p = KubeProfile::load(input).map_err(|e| e.to_string())?;
            let versions: Vec<String> = p.versions.iter().map(|(v, k)| format!("{v} ({})", k.kubernetes)).collect();
            let hooks: Vec<String> = p.hooks.keys().map(|k| k.to_string()).collect();
            Ok(format!(
                "kube profile · upgrades to {} · hooks: {} · {} probe(s), {} condition check(s), {} command probe(s) · API workload: {}",
                if versions.is_empty() { "no version".to_string() } else { versions.join(", ") },
                if hooks.is_empty() { "none".to_string() } else { hooks.join(", ") },
                p.probes.len(),
                p.conditions.len(),
                p.commands.len(),
                if p.api.is_some() { "yes" } else { "no" },
            ))
        }
        Kind::AppProfile => {
            let p = AppProfile::load(input).map_err(|e| e.to_string())?;
            let app_ops: Vec<OpKind> = OpKind::ALL.into_iter().filter(|k| k.drawn_for(crate::faults::Stack::App)).collect();
            let without: Vec<String> = app_ops.iter().filter(|k| p.supports(**k).is_err()).map(|k| k.to_string()).collect();
            Ok(format!(
                "app profile {}/{} · operator {} · data workload: {} · {} probe(s) · {} of {} app ops{}",
                p.namespace,
                p.statefulset,
                p.operator.as_deref().unwrap_or("none"),
                if p.data.is_some() { "yes" } else { "no (app-durability and app-linearizability not checked)" },
                p.probes.len(),
                app_ops.len() - without.len(),
                app_ops.len(),
                if without.is_empty() { String::new() } else { format!(" (skipped: {})", without.join(", ")) }
            ))
        }
        Kind::Record => {
            let text = std::fs::read_to_string(input).map_err(|e| format!("cannot read seed record: {e}"))?;
            // The checks of `replay` and `shrink` before they run: the record's shape, its
            // profile, its plans against the profile's model, its failure's step, then its target.
            let r = SeedRecord::parse(&text).map_err(|e| e.to_string())?;
            TargetSpec::from_options(r.target.kind(), &TargetOptions::default(), Some(&r.target)).map_err(|e| e.message)?;
            stack_fits(r.target.kind(), &r.profile).map_err(|e| e.message)?;
            let f = &r.failure;
            let what = match f.invariant {
                Some(i) => format!("{i} violated"),
                None => format!("{:?}", f.kind).to_lowercase(),
            };
            Ok(format!(
                "seed record seed {} · target {} · profile {} · {} ops{} · recorded: {what} at step {} ({}) · expect {}",
                r.seed,
                r.target.describe(),
                r.profile.name,
                r.plan.ops.len(),
                r.shrunk.as_ref().map(|s| format!(" (shrunk to {})", s.ops.len())).unwrap_or_default(),
                f.step,
                f.op,
                match r.expect {
                    crate::record::Expect::Fail => "fail",
                    crate::record::Expect::Pass => "pass",
                }
            ))
        }
    }
}

/// `profile NAME · stack S · …`: what a run of it has, and the targets it runs on.
fn profile_summary(p: &Profile) -> String {
    let stack = serde_json::to_value(p.stack).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    let versions: Vec<String> = p.versions.iter().map(|v| v.to_string()).collect();
    let targets: Vec<&str> = [(TargetKind::Local, "local"), (TargetKind::Kube, "kube"), (TargetKind::App, "app")]
        .into_iter()
        .filter(|(k, _)| stack_fits(*k, p).is_ok())
        .map(|(_, n)| n)
        .collect();
    let invariants = profiles::invariants(p).map(|i| i.len()).unwrap_or(0);
    format!(
        "profile {} · stack {stack} · {} member{} on {} site{} · versions {} · {} steps · {invariants} invariants · runs on --target {}",
        p.name,
        p.members,
        if p.members == 1 { "" } else { "s" },
        p.sites,
        if p.sites == 1 { "" } else { "s" },
        versions.join(", "),
        p.steps,
        targets.join("|")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed record is told by keys no profile of any kind has.
    #[test]
    fn the_record_keys_belong_to_no_profile() {
        for keys in [keys_of::<Profile>(), keys_of::<KubeProfile>(), keys_of::<AppProfile>()] {
            assert!(!keys.is_empty());
            for k in RECORD_KEYS {
                assert!(!keys.contains(k), "{k} is a profile's key too: {keys:?}");
            }
        }
    }
}
