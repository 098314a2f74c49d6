//! shakedown: seeded fault plans against real infrastructure stacks, invariants after every
//! step, failing seeds recorded and replayable.
//!
//! The pure parts live in `shakedown-faults` (model, ops, generation) and
//! `shakedown-invariants` (checks). This crate does the IO: targets, the run engine,
//! recording, replay and the CLI.

pub mod binaries;
pub mod cli;
pub mod clock;
pub mod command;
pub mod engine;
pub mod entry;
pub mod events;
pub mod exit;
pub mod k8s;
#[cfg(test)]
mod layering;
pub mod node;
pub mod pki;
pub mod private;
pub mod procs;
pub mod profiles;
pub mod rate;
pub mod record;
pub mod reference;
pub mod report;
pub mod targets;

pub use shakedown_faults as faults;
pub use shakedown_history as history;
pub use shakedown_invariants as invariants;
