//! The host's network state, to compare before and after a node: links, addresses, routes (IPv4
//! and IPv6, every table), the whole nftables ruleset and every network sysctl. What changes by
//! itself is left out: address lifetimes and route expiry count down, rule counters count, and
//! `nf_conntrack_count` is the number of connections tracked right now. So are the local target's
//! per-run tables (`inet shakedown_sd_…`, see `targets::local::nft`): the test runner runs the
//! local stack's tests beside the node's, and a site isolation of theirs is not the node's change.
//! The node's own table (`shakedown-node-…`) and everything else stay compared.

use std::collections::BTreeMap;
use std::process::Command;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNet {
    pub links: String,
    pub addresses: String,
    pub routes: String,
    pub ruleset: String,
    pub sysctls: BTreeMap<String, String>,
}

fn out(program: &str, args: &[&str]) -> String {
    let o = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(o.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Drops the value after each of `words` (`valid_lft 3600sec` → `valid_lft`).
fn without_values(text: &str, words: &[&str]) -> String {
    text.lines()
        .map(|l| {
            let mut skip = false;
            l.split_whitespace()
                .filter(|w| {
                    let keep = !skip;
                    skip = words.contains(w);
                    keep
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sysctls(dir: &std::path::Path, out: &mut BTreeMap<String, String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            sysctls(&p, out);
        } else if p.file_name().is_some_and(|n| n != "nf_conntrack_count") {
            // Write-only entries (route/flush) cannot be read: they hold no state.
            if let Ok(v) = std::fs::read_to_string(&p) {
                out.insert(p.display().to_string(), v.trim().to_string());
            }
        }
    }
}

/// The ruleset without the top-level blocks of local-target runs' tables (`table inet
/// shakedown_sd_… { … }`, closed by a `}` in the first column).
fn without_local_runs(ruleset: &str) -> String {
    let mut kept = Vec::new();
    let mut skipping = false;
    for line in ruleset.lines() {
        if !skipping && line.starts_with("table inet shakedown_sd_") {
            skipping = true;
        } else if skipping {
            skipping = line != "}";
        } else {
            kept.push(line);
        }
    }
    kept.join("\n")
}

pub fn snapshot() -> HostNet {
    let mut s = BTreeMap::new();
    sysctls(std::path::Path::new("/proc/sys/net"), &mut s);
    HostNet {
        links: out("ip", &["-o", "link", "show"]),
        addresses: without_values(&out("ip", &["-o", "addr", "show"]), &["valid_lft", "preferred_lft"]),
        routes: without_values(
            &format!("{}{}", out("ip", &["-4", "route", "show", "table", "all"]), out("ip", &["-6", "route", "show", "table", "all"])),
            &["expires"],
        ),
        ruleset: without_local_runs(&out("nft", &["--stateless", "list", "ruleset"])),
        sysctls: s,
    }
}

/// Panics with what differs between `before` and `now` (`when` says which comparison).
pub fn assert_same(before: &HostNet, now: &HostNet, when: &str) {
    if before == now {
        return;
    }
    let mut diff = vec![];
    for (what, a, b) in [
        ("links", &before.links, &now.links),
        ("addresses", &before.addresses, &now.addresses),
        ("routes", &before.routes, &now.routes),
        ("nftables ruleset", &before.ruleset, &now.ruleset),
    ] {
        if a != b {
            diff.push(format!("{what}:\n--- before\n{a}\n--- now\n{b}"));
        }
    }
    for (k, v) in &now.sysctls {
        if before.sysctls.get(k) != Some(v) {
            diff.push(format!("sysctl {k}: {:?} -> {v:?}", before.sysctls.get(k)));
        }
    }
    for k in before.sysctls.keys().filter(|k| !now.sysctls.contains_key(*k)) {
        diff.push(format!("sysctl {k} is gone"));
    }
    panic!("the host's network changed {when}:\n{}", diff.join("\n"));
}

/// Only a local run's table is left out: the node's own table and every other stay compared.
#[test]
fn a_local_runs_table_is_left_out_of_the_ruleset_and_nothing_else() {
    let ruleset =
        "table inet shakedown_sd_1a2b3c4d {\n\tchain out {\n\t\ttype filter hook output priority filter; policy accept;\n\t}\n}\n\
                   table inet shakedown-node-ab12 {\n\tchain output {\n\t}\n}\ntable ip nat {\n}\n";
    assert_eq!(without_local_runs(ruleset), "table inet shakedown-node-ab12 {\n\tchain output {\n\t}\n}\ntable ip nat {\n}");
}
