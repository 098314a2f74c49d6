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
    match rt.block_on(cli::dispatch(args)) {
        Ok(exit) => exit.into(),
        Err(fatal) => {
            eprintln!("error: {}", fatal.message);
            fatal.exit.into()
        }
    }
}
