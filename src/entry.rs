//! The `shakedown` process around the command line. See `shakedown --help` and the README for
//! exit codes.

use std::process::ExitCode;

use clap::Parser;

/// glibc's malloc arenas for the whole process (its default is 8 per core). A soak lives for
/// hours while threads come and go (the runtime's blocking pool, the bounded commands of
/// teardown); each new thread may get an arena of its own, and what an arena keeps after a seed
/// shows as RSS growth that is not a leak: a heap profile of a 15-minute release-tier soak
/// shows the live heap between seeds flat (158 → 180 KiB) while RSS grew. Two arenas keep the
/// retained memory bounded (docs/development.md, "Soak memory").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_ARENAS: libc::c_int = 2;

/// The whole `shakedown` process: allocator settings, the panic hook, the CLI, the runtime and
/// the exit code. Here in the library rather than in `main.rs`: the binary crate then compiles in
/// a second instead of instantiating the async runtime's and the commands' generics again (50 s
/// of a release build, after the library's, on the critical path).
pub fn main() -> ExitCode {
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    // An explicit MALLOC_ARENA_MAX in the environment wins (then this is not called).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
    }
    // A print to a closed stdout panics in Rust's std (SIGPIPE is ignored, so the write fails
    // with EPIPE): that panic is not a bug, and ends the command quietly (exit 141) once it has
    // unwound through whatever the command had started (its teardown runs on the way).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.payload().downcast_ref::<String>().map(String::as_str).or_else(|| info.payload().downcast_ref::<&str>().copied());
        if text.is_some_and(is_broken_pipe) {
            BROKEN_PIPE.store(true, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        default_hook(info)
    }));
    let args = crate::cli::Cli::parse();
    crate::cli::init_logging(args.log_format);
    // Under --log-format json every line of stderr is JSON, the last one (the error) included.
    let json = matches!(args.log_format, crate::cli::LogFormat::Json);
    let fail = |message: &str, exit: crate::exit::Exit| {
        if json {
            // Written directly, not through the log filter: RUST_LOG must not hide the outcome.
            let line = serde_json::json!({
                "timestamp": crate::clock::now_rfc3339(),
                "level": "ERROR",
                "fields": {"message": message, "exit": exit.code()},
                "target": "shakedown",
            });
            eprintln!("{line}");
        } else {
            eprintln!("error: {message}");
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            fail(&format!("cannot start the async runtime: {e}"), crate::exit::Exit::Environment);
            return crate::exit::Exit::Environment.into();
        }
    };
    // A panic unwinds through the target, whose Drop tears the stack down; it then ends here as
    // the documented internal-error exit code rather than Rust's 101.
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(crate::cli::dispatch(args))));
    match res {
        Ok(Ok(exit)) => exit.into(),
        Ok(Err(fatal)) => {
            fail(&fatal.message, fatal.exit);
            fatal.exit.into()
        }
        Err(_) if BROKEN_PIPE.load(std::sync::atomic::Ordering::SeqCst) => crate::exit::Exit::BrokenPipe.into(),
        Err(_) => {
            fail(
                "internal error (a bug in shakedown; the message is above); anything it had started was torn down",
                crate::exit::Exit::Internal,
            );
            crate::exit::Exit::Internal.into()
        }
    }
}

/// Set by the panic hook when a print found stdout closed.
static BROKEN_PIPE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a panic's message is std's for a print to a closed pipe.
fn is_broken_pipe(message: &str) -> bool {
    message.starts_with("failed printing to stdout") && message.contains("Broken pipe")
}
