//! The machine's processes, as `/proc` shows them: how a run's and a node's processes are found
//! by the directory on their command line, with no bookkeeping of shakedown's own (so `reap`
//! finds them after a `kill -9`); and the tails of their logs.

use std::path::Path;

/// Processes (pid, command line) whose command line mentions `run_dir`.
pub fn processes_of(run_dir: &Path) -> Vec<(i32, String)> {
    let marker = run_dir.to_string_lossy().to_string();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmd.contains(&marker).then(|| (pid, cmd.trim().to_string()))
        })
        .collect()
}

/// The last `n` lines of a file (reads at most the last 1 MiB).
pub fn tail_lines(path: &Path, n: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return format!("(cannot open {})\n", path.display()) };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(1 << 20)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[lines.len().saturating_sub(n)..].join("\n");
    out.push('\n');
    out
}
