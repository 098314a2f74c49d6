//! shakedown's history checker: given every request a run's clients sent, with when they sent
//! it, when the answer came and what it said (or that none came), is there one order of the
//! requests, consistent with real time, in which every answer is what a correct store gives?
//!
//! - [`format`]: the history file (JSON Lines), for etcd's key-value API and for plain
//!   registers.
//! - [`search`]: the search for such an order over any [`search::Model`], with a bound: a search
//!   that runs out of it is undecided, never a pass.
//! - [`kv`] and [`register`]: the models.
//! - [`check`](check()): the whole check — etcd's revisions against real time, then one search per
//!   key and epoch.
//! - [`serializable`]: serializable reads against the state at the revision they claim.
//! - [`incremental`]: the same verdict for a history that grows, judging only what is new
//!   since the last check.
//!
//! Architecture invariant: this crate never does IO.

pub mod check;
pub mod format;
pub mod incremental;
pub mod kv;
pub mod register;
pub mod search;
pub mod serializable;

pub use check::{check, describe, Finding, FindingKind, Report, Verdict, DEFAULT_BOUND};
pub use format::{History, ModelKind, Operation, ParseError, Request};
pub use incremental::Incremental;
