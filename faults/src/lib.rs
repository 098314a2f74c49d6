//! shakedown's model and op catalogue.
//!
//! Everything here is pure: values in, values out, no IO, no clock, no OS randomness.
//! - [`model`]: the expected state of the stack (sites, members, versions, who is down).
//! - [`op`]: the catalogue of ops, each with a precondition and an effect on the model.
//! - [`profile`]: named tiers (plan length, op weights, bounds), loaded from TOML.
//! - [`shrink`]: delta debugging over a failing op list, proposing only valid plans.
//! - [`generate`]: plans from (seed, profile) with proptest strategies over ChaCha,
//!   as a reference state machine: the next op is drawn from the current model.
//!
//! Architecture invariant: this crate never does IO and never reads the OS RNG.

pub mod generate;
pub mod model;
pub mod op;
pub mod profile;
pub mod seed;
pub mod shrink;

pub use generate::{generate, next_op_strategy, Plan, Weights};
pub use model::{Answers, BackupId, DiskState, Member, MemberId, MemberState, Model, OutageMode, SiteId, Version};
pub use op::{Op, OpKind, PreconditionError, MAX_BACKUPS};
pub use profile::{Profile, ProfileError};
pub use shrink::{repair, without, Shrinker};

/// Finds the entry of a registry named `s`; the error lists every known name.
/// (Op kinds, invariants and planted bugs are all parsed this way.)
pub fn parse_name<T: Copy>(s: &str, all: &[T], name: fn(T) -> &'static str, what: &str) -> Result<T, String> {
    all.iter().copied().find(|&t| name(t) == s).ok_or_else(|| {
        let known: Vec<&str> = all.iter().map(|&t| name(t)).collect();
        format!("unknown {what} {s:?}; known: {}", known.join(", "))
    })
}
