//! `--partition i/n`: one pod's share of the seeds when n pods (an Indexed Job) run one seed
//! space. Partition i of n takes the seeds S+i, S+i+n, S+i+2n, … of the base seed S: `run
//! --count K` the first K of them, `soak` as many as fit in its time. The n partitions of one
//! base seed never share a seed, and together with K seeds each they cover exactly S … S+nK-1
//! (arithmetic wraps at 2^64, like a soak's next seed).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// This pod's index, 0 ≤ index < of.
    pub index: u64,
    /// How many pods share the seed space.
    pub of: u64,
}

impl Partition {
    /// The whole seed space (no `--partition`): S, S+1, S+2, …
    pub const WHOLE: Partition = Partition { index: 0, of: 1 };

    /// The `j`-th seed (from 0) of this partition of base seed `base`.
    pub fn seed(&self, base: u64, j: u64) -> u64 {
        base.wrapping_add(self.index).wrapping_add(j.wrapping_mul(self.of))
    }

    /// `true` for the whole seed space.
    pub fn is_whole(&self) -> bool {
        self.of == 1
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.of)
    }
}

const FORM: &str = "write i/n: this pod's index from 0 and the number of pods, e.g. 3/8; in an Indexed Job set SHAKEDOWN_PARTITION to \"$(JOB_COMPLETION_INDEX)/N\" with N = the Job's completions";

/// Parses `i/n` (clap value parser: an error is a usage error, exit 2).
pub fn parse_partition(s: &str) -> Result<Partition, String> {
    let t = s.trim();
    if t.contains("$(") {
        return Err(format!(
            "{t:?} holds a variable reference Kubernetes did not expand: JOB_COMPLETION_INDEX is set only in the pods of an Indexed Job (completionMode: Indexed, Kubernetes 1.22 or later), and only variables defined before SHAKEDOWN_PARTITION in the container's env are expanded"
        ));
    }
    let Some((i, n)) = t.split_once('/') else {
        return Err(format!("{t:?} is not a partition: {FORM}"));
    };
    let num = |what: &str, v: &str| v.trim().parse::<u64>().map_err(|_| format!("{what} {v:?} in {t:?} is not a whole number: {FORM}"));
    let (index, of) = (num("index", i)?, num("count", n)?);
    if of == 0 {
        return Err(format!("{t:?}: the number of pods must be at least 1: {FORM}"));
    }
    if index >= of {
        return Err(format!("{t:?}: index {index} is not below the number of pods {of} (indices run from 0 to {}; JOB_COMPLETION_INDEX does so for completions = {of})", of - 1));
    }
    Ok(Partition { index, of })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn parses_index_and_count() {
        assert_eq!(parse_partition("0/1"), Ok(Partition::WHOLE));
        assert_eq!(parse_partition("3/8"), Ok(Partition { index: 3, of: 8 }));
        assert_eq!(parse_partition(" 7/8 "), Ok(Partition { index: 7, of: 8 }));
        assert_eq!(parse_partition("3/8").unwrap().to_string(), "3/8");
    }

    #[test]
    fn refuses_bad_values_with_what_to_write() {
        for (bad, says) in [
            ("8/8", "index 8 is not below the number of pods 8 (indices run from 0 to 7"),
            ("9/8", "not below"),
            ("0/0", "at least 1"),
            ("3", "is not a partition"),
            ("", "is not a partition"),
            ("a/8", "index \"a\""),
            ("3/b", "count \"b\""),
            ("-1/8", "not a whole number"),
            ("1/2/3", "not a whole number"),
            ("$(JOB_COMPLETION_INDEX)/8", "Indexed Job"),
        ] {
            let e = parse_partition(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn partitions_are_disjoint_and_cover_a_block() {
        let base = 1000;
        let (n, k) = (8u64, 4u64);
        let mut all = BTreeSet::new();
        for i in 0..n {
            let p = Partition { index: i, of: n };
            for j in 0..k {
                assert!(all.insert(p.seed(base, j)), "seed {} twice", p.seed(base, j));
            }
        }
        assert_eq!(all, (base..base + n * k).collect());
        assert_eq!((0..3).map(|j| Partition { index: 2, of: 8 }.seed(1000, j)).collect::<Vec<_>>(), [1002, 1010, 1018]);
        assert_eq!((0..3).map(|j| Partition::WHOLE.seed(5, j)).collect::<Vec<_>>(), [5, 6, 7]);
    }

    #[test]
    fn seeds_wrap_at_u64() {
        let p = Partition { index: 1, of: 4 };
        assert_eq!(p.seed(u64::MAX, 0), 0);
        assert_eq!(p.seed(u64::MAX - 1, 1), 3);
    }
}
