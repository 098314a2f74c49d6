//! Documented exit codes. Keep in sync with the README.

use std::process::ExitCode;

/// What a shakedown command ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every invariant held (for `replay`: the outcome matched the record's expectation).
    Pass = 0,
    /// A safety invariant was violated.
    Violation = 1,
    /// Bad command line or bad input file (unknown profile, malformed seed record, invalid plan).
    Usage = 2,
    /// Liveness: after healing, the stack did not converge within the bound, or an op's own
    /// wait (a member becoming healthy) ran out.
    Liveness = 3,
    /// The environment cannot run the stack: a binary is missing, a loop device or a port could
    /// not be had, a command failed.
    Environment = 4,
    /// A bug in shakedown itself.
    Internal = 5,
    /// `check-history`: no violation found, but a search ran out of its bound before it could
    /// decide (never a pass).
    Undecided = 6,
    /// Interrupted by Ctrl-C or SIGTERM; the stack was torn down.
    Interrupted = 130,
    /// Standard output was closed by its reader (`shakedown plan | head`): the command stopped
    /// quietly, as a program killed by SIGPIPE reports in a shell (128 + 13); anything it had
    /// started was torn down.
    BrokenPipe = 141,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// An error that ends a command, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Fatal {
    pub exit: Exit,
    pub message: String,
}

impl Fatal {
    pub fn usage(message: impl Into<String>) -> Fatal {
        Fatal { exit: Exit::Usage, message: message.into() }
    }
    pub fn environment(message: impl Into<String>) -> Fatal {
        Fatal { exit: Exit::Environment, message: message.into() }
    }
    pub fn internal(message: impl Into<String>) -> Fatal {
        Fatal { exit: Exit::Internal, message: message.into() }
    }
}
