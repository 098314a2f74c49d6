//! External commands (mkfs, e2fsck, mount, nft, etcdutl, haproxy -v …), always bounded: a command
//! that has not exited within its bound is killed and reported, never waited on forever.
//!
//! Two forms. [`run`] is async (a tokio process): the ops of the local target use it, so a
//! running command never holds up the runtime's workers (the serving sampler keeps sampling)
//! and an op's own timeout interrupts it — dropping the future kills the command. The blocking
//! form, [`run_bounded`], is for code that cannot await: teardown from `Drop`, `reap`, and the
//! binary discovery that runs before a runtime exists.

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Why an external command gave no output: it could not start, could not be waited for, or
/// did not exit within its bound (and was killed).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot wait for {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{what}` did not exit within {}s (killed)", bound.as_secs())]
    Timeout { what: String, bound: Duration },
}

/// How long one external command may run: mkfs of a 256 MiB image, e2fsck, a mount, an nft
/// call or a snapshot restore take well under a second here; a minute means it hangs.
pub const COMMAND_BOUND: Duration = Duration::from_secs(60);

/// How long `--version` of a binary may take (binary discovery).
pub const VERSION_BOUND: Duration = Duration::from_secs(10);

/// Runs `program args` with stdin closed, collecting its output; kills it after `bound`, or as
/// soon as the returned future is dropped (an op timeout). `Err` when it cannot
/// start or did not exit in time.
pub async fn run(program: &str, args: &[&str], bound: Duration) -> Result<Output, CommandError> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args);
    run_cmd(cmd, &format!("{program} {}", args.join(" ")), bound).await
}

/// [`run`] for a prepared command (`what` names it in errors).
pub async fn run_cmd(mut cmd: tokio::process::Command, what: &str, bound: Duration) -> Result<Output, CommandError> {
    let program = cmd.as_std().get_program().to_string_lossy().to_string();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CommandError::Spawn { program: program.clone(), source })?;
    // Dropping the wait (bound reached, or the caller's future dropped) drops the child, which
    // kill_on_drop kills; tokio reaps it in the background.
    match tokio::time::timeout(bound, child.wait_with_output()).await {
        Ok(out) => out.map_err(|source| CommandError::Wait { program, source }),
        Err(_) => Err(CommandError::Timeout { what: what.to_string(), bound }),
    }
}

/// Blocking form of [`run`], for code that cannot await (teardown from `Drop`, `reap`, binary
/// discovery).
/// `Err` when it cannot start or did not exit in time.
pub fn run_bounded(program: &str, args: &[&str], bound: Duration) -> Result<Output, CommandError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_bounded_cmd(cmd, &format!("{program} {}", args.join(" ")), bound)
}

/// [`run_bounded`] for a prepared command (`what` names it in errors).
pub fn run_bounded_cmd(mut cmd: Command, what: &str, bound: Duration) -> Result<Output, CommandError> {
    let program = cmd.get_program().to_string_lossy().to_string();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CommandError::Spawn { program: program.clone(), source })?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    // The waiting thread ends when the child does (killed below at the latest).
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => out.map_err(|source| CommandError::Wait { program, source }),
        Err(_) => {
            // SAFETY: kill(2) on the child we started; it has not been reaped (no answer yet).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            Err(CommandError::Timeout { what: what.to_string(), bound })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_bound_is_killed_and_reported() {
        let t = std::time::Instant::now();
        let err = run_bounded("sleep", &["30"], Duration::from_millis(200)).unwrap_err().to_string();
        assert!(err.contains("did not exit within 0s (killed)"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let out = run_bounded("sh", &["-c", "echo out; echo err >&2; exit 3"], Duration::from_secs(10)).unwrap();
        assert_eq!((out.status.code(), out.stdout.as_slice(), out.stderr.as_slice()), (Some(3), &b"out\n"[..], &b"err\n"[..]));
        assert!(run_bounded("/nonexistent/x", &[], Duration::from_secs(1)).unwrap_err().to_string().contains("cannot run /nonexistent/x"));
    }

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with('Z')))
    }

    #[tokio::test]
    async fn an_async_command_is_bounded_and_dropping_it_kills_it() {
        let t = std::time::Instant::now();
        let err = run("sleep", &["30"], Duration::from_millis(200)).await.unwrap_err().to_string();
        assert!(err.contains("did not exit within 0s (killed)"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let out = run("sh", &["-c", "echo out; echo err >&2; exit 3"], Duration::from_secs(10)).await.unwrap();
        assert_eq!((out.status.code(), out.stdout.as_slice(), out.stderr.as_slice()), (Some(3), &b"out\n"[..], &b"err\n"[..]));
        assert!(run("/nonexistent/x", &[], Duration::from_secs(1)).await.unwrap_err().to_string().contains("cannot run /nonexistent/x"));
        // An op timeout drops the future: the command must not outlive it. The shell writes its
        // pid first so the test can look for it afterwards.
        let dir = std::env::temp_dir().join(format!("shakedown-cmd-{}", std::process::id()));
        let pidfile = dir.with_extension("pid");
        let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
        let cut = tokio::time::timeout(Duration::from_millis(500), run("sh", &["-c", &script], Duration::from_secs(60))).await;
        assert!(cut.is_err(), "the outer timeout fired first");
        let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        let _ = std::fs::remove_file(&pidfile);
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !alive(pid)
        });
        assert!(gone, "sleep (pid {pid}) still runs after its future was dropped");
    }
}
