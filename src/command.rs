//! External commands (mkfs, e2fsck, mount, nft, etcdutl, haproxy -v …), always bounded: a command
//! that has not exited within its bound is killed and reported, never waited on forever.
//!
//! The local target's ops call these from async code; [`blocking`] lets such a call block its
//! worker without starving the runtime (the serving sampler keeps sampling meanwhile).

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long one external command may run: mkfs of a 256 MiB image, e2fsck, a mount, an nft
/// call or a snapshot restore take well under a second here; a minute means it hangs.
pub const COMMAND_BOUND: Duration = Duration::from_secs(60);

/// How long `--version` of a binary may take (binary discovery).
pub const VERSION_BOUND: Duration = Duration::from_secs(10);

/// Runs `program args` with stdin closed, collecting its output; kills it after `bound`.
/// `Err` (a sentence) when it cannot start or did not exit in time.
pub fn run_bounded(program: &str, args: &[&str], bound: Duration) -> Result<Output, String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_bounded_cmd(cmd, &format!("{program} {}", args.join(" ")), bound)
}

/// [`run_bounded`] for a prepared command (`what` names it in errors).
pub fn run_bounded_cmd(mut cmd: Command, what: &str, bound: Duration) -> Result<Output, String> {
    let program = cmd.get_program().to_string_lossy().to_string();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    // The waiting thread ends when the child does (killed below at the latest).
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => out.map_err(|e| format!("cannot wait for {program}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the child we started; it has not been reaped (no answer yet).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            Err(format!("`{what}` did not exit within {}s (killed)", bound.as_secs()))
        }
    }
}

/// Runs `f`, which blocks (external commands, file system calls), without holding up the other
/// tasks of a multi-threaded runtime; on any other runtime (or none) it just runs.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_bound_is_killed_and_reported() {
        let t = std::time::Instant::now();
        let err = run_bounded("sleep", &["30"], Duration::from_millis(200)).unwrap_err();
        assert!(err.contains("did not exit within 0s (killed)"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let out = run_bounded("sh", &["-c", "echo out; echo err >&2; exit 3"], Duration::from_secs(10)).unwrap();
        assert_eq!((out.status.code(), out.stdout.as_slice(), out.stderr.as_slice()), (Some(3), &b"out\n"[..], &b"err\n"[..]));
        assert!(run_bounded("/nonexistent/x", &[], Duration::from_secs(1)).unwrap_err().contains("cannot run /nonexistent/x"));
    }
}
