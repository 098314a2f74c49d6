//! The shipped profiles (`ci/profiles/*.toml`, built into the binary) and loading by name or path.

use std::path::Path;

use shakedown_faults::Profile;
use shakedown_invariants::InvariantId;

use crate::exit::Fatal;

/// (name, TOML) of every shipped profile.
pub const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../ci/profiles/default.toml")),
    ("smoke", include_str!("../ci/profiles/smoke.toml")),
    ("nightly", include_str!("../ci/profiles/nightly.toml")),
    ("release", include_str!("../ci/profiles/release.toml")),
    ("control-plane", include_str!("../ci/profiles/control-plane.toml")),
    ("failpoints", include_str!("../ci/profiles/failpoints.toml")),
    ("app-smoke", include_str!("../ci/profiles/app-smoke.toml")),
    ("app-release", include_str!("../ci/profiles/app-release.toml")),
    ("app-database", include_str!("../ci/profiles/app-database.toml")),
    ("app-full", include_str!("../ci/profiles/app-full.toml")),
];

/// A profile by shipped name, or from a TOML file when `name_or_path` names one.
pub fn load(name_or_path: &str) -> Result<Profile, Fatal> {
    let text = if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
        text.to_string()
    } else if name_or_path.ends_with(".toml") || Path::new(name_or_path).is_file() {
        std::fs::read_to_string(name_or_path).map_err(|e| Fatal::usage(format!("cannot read profile file {name_or_path}: {e}")))?
    } else {
        let known: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
        return Err(Fatal::usage(format!(
            "unknown profile {name_or_path:?}: known profiles are {}, or give the path of a .toml file",
            known.join(", ")
        )));
    };
    parse(&text)
}

/// Parses and validates a profile, including its invariant names.
pub fn parse(text: &str) -> Result<Profile, Fatal> {
    let profile = Profile::from_toml(text).map_err(|e| Fatal::usage(e.to_string()))?;
    invariants(&profile)?;
    Ok(profile)
}

/// The invariants a profile checks, in registry order.
/// Whether `id` judges a stack of this shape (the default set of a profile of that stack).
pub fn of_stack(id: InvariantId, stack: shakedown_faults::Stack) -> bool {
    let app = matches!(id, InvariantId::AppReady | InvariantId::AppDurability | InvariantId::AppLinearizability);
    match stack {
        shakedown_faults::Stack::App => app || id == InvariantId::Leaks,
        _ => !app,
    }
}

pub fn invariants(profile: &Profile) -> Result<Vec<InvariantId>, Fatal> {
    match &profile.invariants {
        // Those of the profile's stack: an application's (with leaks) for `stack = "app"`,
        // every other one elsewhere.
        None => Ok(InvariantId::ALL.into_iter().filter(|id| of_stack(*id, profile.stack)).collect()),
        Some(names) => {
            let mut ids = names
                .iter()
                .map(|n| n.parse::<InvariantId>().map_err(|e| Fatal::usage(format!("profile {:?}: {e}", profile.name))))
                .collect::<Result<Vec<_>, _>>()?;
            ids.sort();
            ids.dedup();
            Ok(ids)
        }
    }
}
