//! A register: read, write and compare-and-set (values interned by the caller; `None` is the
//! initial, never-written value).

use crate::search::Model;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegOp {
    /// What the read returned (`None` outside: unknown outcome).
    Read(Option<Option<u32>>),
    /// The value, and whether the write is known to have been done.
    Write(u32, bool),
    /// from, to, and whether it swapped (`None`: unknown).
    Cas(Option<u32>, u32, Option<bool>),
}

pub struct Register;

impl Model for Register {
    type State = Option<u32>;
    type Op = RegOp;

    fn step(&self, s: &Option<u32>, op: &RegOp) -> Vec<Option<u32>> {
        match *op {
            RegOp::Read(None) => vec![*s],
            RegOp::Read(Some(v)) => (v == *s).then_some(*s).into_iter().collect(),
            RegOp::Write(v, true) => vec![Some(v)],
            RegOp::Write(v, false) => dedup(vec![*s, Some(v)]),
            RegOp::Cas(from, to, Some(true)) => (*s == from).then_some(Some(to)).into_iter().collect(),
            RegOp::Cas(from, _, Some(false)) => (*s != from).then_some(*s).into_iter().collect(),
            RegOp::Cas(from, to, None) => dedup(if *s == from { vec![*s, Some(to)] } else { vec![*s] }),
        }
    }
}

fn dedup(mut v: Vec<Option<u32>>) -> Vec<Option<u32>> {
    v.dedup();
    v
}
