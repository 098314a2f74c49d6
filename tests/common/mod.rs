//! Helpers for tests that run the real `shakedown` binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shakedown"));
    c.env("RUST_LOG", "warn");
    c
}

pub fn run(args: &[&str], dirs: &Dirs) -> Output {
    let out = bin().args(args).arg("--runs-dir").arg(&dirs.runs).arg("--seeds-dir").arg(&dirs.seeds).output().expect("shakedown runs");
    eprintln!("$ shakedown {}\n--- stdout\n{}--- stderr\n{}", args.join(" "), text(&out.stdout), text(&out.stderr));
    out
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

pub struct Dirs {
    _tmp: tempfile::TempDir,
    pub runs: PathBuf,
    pub seeds: PathBuf,
}

pub fn dirs() -> Dirs {
    remember_panics();
    let tmp = tempfile::Builder::new().prefix("shakedown-test-").tempdir().expect("tempdir");
    let runs = tmp.path().join("runs");
    let seeds = tmp.path().join("seeds");
    Dirs { runs, seeds, _tmp: tmp }
}

/// A failed test keeps what its runs wrote (event logs, reports, member logs, seed records: no
/// disk images, nothing on another filesystem) in `target/tmp/failed-tests/<its directory>`, and
/// says where: its temporary directory goes with it, and a flake that cannot be read afterwards
/// cannot be root-caused.
impl Drop for Dirs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let name = self._tmp.path().file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            keep_failed(self._tmp.path(), &name);
        }
    }
}

/// The same for a directory of a test that makes its own temporary directories (the
/// application test's runs, records and profiles): kept as `failed-tests/<name>` if the test
/// fails while this is in scope.
pub struct KeepOnFailure {
    pub dir: PathBuf,
    pub name: String,
}

impl KeepOnFailure {
    /// Keeps `dir` as `failed-tests/<name>` if the test fails while this is in scope.
    pub fn new(dir: PathBuf, name: String) -> Self {
        remember_panics();
        KeepOnFailure { dir, name }
    }
}

impl Drop for KeepOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            keep_failed(&self.dir, &self.name);
        }
    }
}

/// The last panic's message and place on each thread: a kept directory says why its test
/// failed (`panic.txt`), since a CI log may show only a part of a long test's output.
static PANICS: std::sync::Mutex<Vec<(std::thread::ThreadId, String)>> = std::sync::Mutex::new(Vec::new());

/// Installs (once) a panic hook that remembers each thread's panic message, then runs the
/// default hook.
pub fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = format!("{info}");
            if let Ok(mut p) = PANICS.lock() {
                let id = std::thread::current().id();
                p.retain(|(t, _)| *t != id);
                p.push((id, msg));
            }
            default(info);
        }));
    });
}

/// Copies what `dir` holds (see [`keep`]) to `target/tmp/failed-tests/<name>` and says where,
/// with the panic that failed the test in `panic.txt`.
fn keep_failed(dir: &Path, name: &str) {
    let to = Path::new(env!("CARGO_TARGET_TMPDIR")).join("failed-tests").join(name);
    let Ok(root) = std::fs::metadata(dir) else { return };
    keep(dir, &to, std::os::unix::fs::MetadataExt::dev(&root));
    let id = std::thread::current().id();
    if let Some((_, msg)) = PANICS.lock().ok().and_then(|p| p.iter().find(|(t, _)| *t == id).cloned()) {
        let _ = std::fs::write(to.join("panic.txt"), msg);
    }
    eprintln!("the failed test's run directories are kept in {}", to.display());
}

/// Copies the regular files under `from` to `to`, leaving out disk images, files over 64 MiB,
/// symbolic links and other filesystems (a member's mounted disk); never fails.
fn keep(from: &Path, to: &Path, dev: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(from) else { return };
    let _ = std::fs::create_dir_all(to);
    for e in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
        if meta.dev() != dev {
            continue;
        }
        let target = to.join(e.file_name());
        if meta.is_dir() {
            keep(&e.path(), &target, dev);
        } else if meta.is_file() && meta.len() <= 64 << 20 && e.path().extension().is_none_or(|x| x != "img") {
            let _ = std::fs::copy(e.path(), &target);
        }
    }
}

/// Everything of a run still on the machine: processes naming the path, mounts and loop devices
/// under it.
pub fn leftovers(root: &Path) -> Vec<String> {
    let root_s = root.canonicalize().unwrap_or(root.to_path_buf()).to_string_lossy().to_string();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if pid == std::process::id() {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if cmd.contains(&root_s) && !zombie {
            left.push(format!("process {pid}: {cmd}"));
        }
    }
    for line in std::fs::read_to_string("/proc/mounts").unwrap().lines() {
        if line.contains(&root_s) {
            left.push(format!("mount: {line}"));
        }
    }
    // nftables tables of runs under `root` (named after the run directory).
    if let Ok(runs) = std::fs::read_dir(root) {
        let tables = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        for run in runs.flatten() {
            let table = format!("shakedown_{}", run.file_name().to_string_lossy().replace(['-', '.'], "_"));
            if tables.contains(&table) {
                left.push(format!("nftables table {table}"));
            }
        }
    }
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Ok(b) = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")) {
            if b.contains(&root_s) {
                left.push(format!("loop device /dev/{name}: {}", b.trim()));
            }
        }
    }
    left
}

/// The only run directory under `runs`.
pub fn only_run_dir(runs: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(runs).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    assert_eq!(dirs.len(), 1, "expected one run directory in {}: {dirs:?}", runs.display());
    dirs.into_iter().next().unwrap()
}

pub fn seed_records(seeds: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(seeds) else { return vec![] };
    let mut v: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect();
    v.sort();
    v
}

/// Parses an XML file with Python's XML parser (a real parser, not a string match) and returns
/// (tests, failures, skipped) of its first test suite and every failure message.
pub fn junit_counts(path: &Path) -> (u32, u32, u32, Vec<String>) {
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
pub fn spawn(args: &[&str], d: &Dirs) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = bin()
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

pub fn wait_line(rx: &std::sync::mpsc::Receiver<String>, needle: &str, limit: Duration) -> Vec<String> {
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

pub fn wait_exit(child: &mut std::process::Child, limit: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        assert!(t0.elapsed() < limit, "did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
