//! A register: read, write and compare-and-set (values interned by the caller; `None` is the
//! initial, never-written value). After a restore (an epoch after the first) the register
//! starts [`Reg::Unseen`]: it holds whatever the restored store held, which its first answer
//! says.

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

/// A register's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reg {
    /// What a restored store holds, before any answer says it: any value, or none.
    Unseen,
    /// The value (`None`: never written).
    Is(Option<u32>),
}

impl Reg {
    /// The state in words, values named by `name`.
    pub fn describe(&self, name: &dyn Fn(u32) -> String) -> String {
        match self {
            Reg::Unseen => "not read yet in this epoch".into(),
            Reg::Is(None) => "never written".into(),
            Reg::Is(Some(v)) => name(*v),
        }
    }
}

pub struct Register;

impl Model for Register {
    type State = Reg;
    type Op = RegOp;

    fn step(&self, s: &Reg, op: &RegOp) -> Vec<Reg> {
        let Reg::Is(s) = *s else { return unseen(op) };
        let is = |v: Option<u32>| Reg::Is(v);
        match *op {
            RegOp::Read(None) => vec![is(s)],
            RegOp::Read(Some(v)) => (v == s).then_some(is(s)).into_iter().collect(),
            RegOp::Write(v, true) => vec![is(Some(v))],
            RegOp::Write(v, false) => dedup(vec![is(s), is(Some(v))]),
            RegOp::Cas(from, to, Some(true)) => (s == from).then_some(is(Some(to))).into_iter().collect(),
            RegOp::Cas(from, _, Some(false)) => (s != from).then_some(is(s)).into_iter().collect(),
            RegOp::Cas(from, to, None) => dedup(if s == from { vec![is(s), is(Some(to))] } else { vec![is(s)] }),
        }
    }
}

/// The states `op` leads to from a register nobody has read since the restore: an answer
/// says what it held (a refused compare-and-set only that it did not hold `from`, which
/// leaves it unseen: a looser state, never a false alarm).
fn unseen(op: &RegOp) -> Vec<Reg> {
    match *op {
        RegOp::Read(None) => vec![Reg::Unseen],
        RegOp::Read(Some(v)) => vec![Reg::Is(v)],
        RegOp::Write(v, true) | RegOp::Cas(_, v, Some(true)) => vec![Reg::Is(Some(v))],
        RegOp::Write(v, false) | RegOp::Cas(_, v, None) => vec![Reg::Unseen, Reg::Is(Some(v))],
        RegOp::Cas(_, _, Some(false)) => vec![Reg::Unseen],
    }
}

fn dedup(mut v: Vec<Reg>) -> Vec<Reg> {
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_register_holds_what_its_first_answer_says_and_keeps_it() {
        let r = Register;
        // Its first read says what it held ...
        assert_eq!(r.step(&Reg::Unseen, &RegOp::Read(Some(Some(3)))), vec![Reg::Is(Some(3))]);
        assert_eq!(r.step(&Reg::Unseen, &RegOp::Read(Some(None))), vec![Reg::Is(None)]);
        // ... and a later read must agree with it.
        assert!(r.step(&Reg::Is(Some(3)), &RegOp::Read(Some(None))).is_empty());
        // A write of unknown outcome may or may not have replaced it.
        assert_eq!(r.step(&Reg::Unseen, &RegOp::Write(5, false)), vec![Reg::Unseen, Reg::Is(Some(5))]);
        // A compare-and-set that swapped says it held `from` and now holds `to`.
        assert_eq!(r.step(&Reg::Unseen, &RegOp::Cas(Some(1), 2, Some(true))), vec![Reg::Is(Some(2))]);
    }
}
