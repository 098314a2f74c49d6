//! The `shakedown` command line. See `shakedown --help` and the README for exit codes; the
//! process itself is `shakedown::entry::main`.

fn main() -> std::process::ExitCode {
    shakedown::entry::main()
}
