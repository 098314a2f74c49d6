//! The root crate's layers, checked: a module may use the ones below it, never the ones above.
//! From the bottom: the leaves (`clock`, `command`, `exit`, `pki`, `private`, `procs`), then
//! `k8s` (the Kubernetes layer), then `node` and `targets` (the stacks), then `engine`, `events`,
//! `record` and `report`, then `cli`. Within `targets`, the application and kube targets do not
//! use each other; `targets::reap` dispatches between their reaps. A file's test module may use
//! anything (it is cut off at its first `#[cfg(test)]`).

use std::path::Path;

/// (where, what it must not use): a path prefix under `src/`, and the module paths it must not
/// name.
const RULES: &[(&str, &[&str])] = &[
    ("clock.rs", &["crate::"]),
    ("procs.rs", &["crate::"]),
    ("pki.rs", &["crate::k8s", "crate::targets", "crate::node", "crate::engine", "crate::events", "crate::record", "crate::cli"]),
    ("k8s/", &["crate::targets", "crate::node", "crate::engine", "crate::events", "crate::record", "crate::report", "crate::cli"]),
    ("node/", &["crate::targets", "crate::engine", "crate::events", "crate::record", "crate::report", "crate::cli"]),
    ("targets/", &["crate::engine", "crate::events", "crate::record", "crate::report", "crate::cli", "crate::node"]),
    ("targets/app/", &["crate::targets::kube", "super::kube"]),
    ("targets/kube/", &["crate::targets::app", "super::app"]),
];

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// What of `text` is not test code: everything before its first `#[cfg(test)]`.
fn non_test(text: &str) -> &str {
    text.split("#[cfg(test)]").next().unwrap_or(text)
}

/// The uses of `forbidden` in `text` (its lines naming one), as `line: text`.
fn violations(text: &str, forbidden: &[&str]) -> Vec<String> {
    non_test(text)
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| forbidden.iter().any(|f| l.contains(f)))
        .map(|(i, l)| format!("{}: {}", i + 1, l.trim()))
        .collect()
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    sources(&src, &mut files);
    let mut found = vec![];
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        for (prefix, forbidden) in RULES.iter().filter(|(prefix, _)| rel.starts_with(prefix)) {
            for v in violations(&text, forbidden) {
                found.push(format!("src/{rel}:{v} (src/{prefix} must not use {})", forbidden.join(", ")));
            }
        }
    }
    assert!(found.is_empty(), "a module uses a layer above it:\n{}", found.join("\n"));
}

#[test]
fn the_layering_check_sees_a_use_and_skips_comments_and_tests() {
    let text = "use crate::events::Event;\n// crate::cli in a comment\n#[cfg(test)]\nmod tests { use crate::cli; }\n";
    assert_eq!(violations(text, &["crate::events", "crate::cli"]), vec!["1: use crate::events::Event;".to_string()]);
}
