//! The `shakedown` command line. See `shakedown --help` and the README for exit codes.

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(args.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return shakedown::exit::Exit::Environment.into();
        }
    };
    // A panic unwinds through the target, whose Drop tears the stack down; it then ends here as
    // the documented internal-error exit code rather than Rust's 101.
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(cli::dispatch(args))));
    match res {
        Ok(Ok(exit)) => exit.into(),
        Ok(Err(fatal)) => {
            eprintln!("error: {}", fatal.message);
            fatal.exit.into()
        }
        Err(_) => {
            eprintln!("error: internal error (a bug in shakedown; the message is above); the stack was torn down");
            shakedown::exit::Exit::Internal.into()
        }
    }
}
