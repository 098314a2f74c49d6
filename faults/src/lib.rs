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

pub mod failpoint;
pub mod generate;
pub mod model;
pub mod op;
pub mod profile;
pub mod seed;
pub mod shrink;

pub use failpoint::{Failpoint, FailpointAction};
pub use generate::{draw_etcd_flags, generate, next_op_strategy, Plan, Weights};
pub use model::{Answers, BackupId, DiskState, Member, MemberId, MemberState, Model, OutageMode, SiteId, Version};
pub use op::{pitr_percent, Op, OpKind, PreconditionError, MAX_BACKUPS, PITR_POINTS};
pub use profile::{ApiLoad, EtcdFlag, EtcdFlags, KvMix, Mix, Profile, ProfileError, Stack, Workload, WorkloadKind};
pub use shrink::{repair, without, Shrinker};

/// `n` and a noun, the noun plural unless `n` is 1: "1 member", "3 members".
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Declares a registry enum: its variants with their names, in one list, from which `ALL` (the
/// variants in declaration order), `name()`, `Display` and `FromStr` are generated — so a new
/// variant cannot be left out of `ALL` (op kinds, invariants and planted bugs use it).
///
/// ```
/// shakedown_faults::registry! {
///     /// Colours.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq)]
///     pub enum Colour: "colour" {
///         Red => "red",
///         /// The sky's.
///         Blue => "blue",
///     }
/// }
/// assert_eq!(Colour::ALL, [Colour::Red, Colour::Blue]);
/// assert_eq!("blue".parse::<Colour>(), Ok(Colour::Blue));
/// assert_eq!(Colour::Red.to_string(), "red");
/// assert!("green".parse::<Colour>().unwrap_err().to_string().contains("known: red, blue"));
/// ```
#[macro_export]
macro_rules! registry {
    ($(#[$meta:meta])* $vis:vis enum $name:ident : $what:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order (generated: it cannot miss one).
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The name used in profiles, records, flags and reports.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $crate::parse_name(s, &$name::ALL, $name::name, $what)
            }
        }
    };
}

/// A name no entry of a registry has: what was looked for, what was given, and every known name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; known: {}", known.join(", "))]
pub struct UnknownName {
    pub what: String,
    pub given: String,
    pub known: Vec<&'static str>,
}

/// Finds the entry of a registry named `s`; the error lists every known name.
/// (Op kinds, invariants and planted bugs are all parsed this way.)
pub fn parse_name<T: Copy>(s: &str, all: &[T], name: fn(T) -> &'static str, what: &str) -> Result<T, UnknownName> {
    all.iter().copied().find(|&t| name(t) == s).ok_or_else(|| UnknownName {
        what: what.to_string(),
        given: s.to_string(),
        known: all.iter().map(|&t| name(t)).collect(),
    })
}

#[cfg(test)]
mod counted_tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::counted(1u32, "member"), "1 member");
        assert_eq!(super::counted(0u32, "op"), "0 ops");
        assert_eq!(super::counted(3u64, "step"), "3 steps");
    }
}
