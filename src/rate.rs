//! Reproduction rates of failures that do not reproduce every time: the 95% (Wilson score)
//! interval of a measured rate, and how many runs make missing a failure of a known rate
//! unlikely.

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// The 95% Wilson score interval of `k` reproductions in `n` runs, as (low, high) in [0, 1].
/// Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0 of n or
/// n of n (0 of 8 is 0–32%, not "exactly 0"). `n = 0` says nothing: (0, 1).
pub fn wilson(k: u32, n: u32) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k.min(n) as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// "2 of 8 (25%), 95% interval 7–59%".
pub fn describe(k: u32, n: u32) -> String {
    let (lo, hi) = wilson(k, n);
    let pct = if n == 0 { 0.0 } else { 100.0 * k as f64 / n as f64 };
    format!("{k} of {n} ({pct:.0}%), 95% interval {:.0}–{:.0}%", 100.0 * lo, 100.0 * hi)
}

/// The most runs a corpus replay gives a timing-bound record.
pub const MAX_RUNS: u32 = 20;

/// How many runs a failure that reproduces with probability `p` needs so that missing it in
/// every run has a probability of at most 5%: `ceil(ln 0.05 / ln(1 - p))`, capped at `cap` and
/// never below `at_least`. A rate of 1 (or more) needs `at_least`; a rate of 0 (or less, or not a
/// number) says nothing about how many would do, so it gets `cap`.
pub fn runs_to_catch(p: f64, at_least: u32, cap: u32) -> u32 {
    let n = if p >= 1.0 {
        1
    } else if p > 0.0 {
        // The epsilon keeps an exact quotient (p = 0.95: 1.0000000000000002) from rounding up.
        ((0.05f64.ln() / (1.0 - p).ln()) - 1e-9).ceil().max(1.0).min(cap as f64) as u32
    } else {
        cap
    };
    n.min(cap).max(at_least)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: (f64, f64), b: (f64, f64)) -> bool {
        (a.0 - b.0).abs() < 5e-4 && (a.1 - b.1).abs() < 5e-4
    }

    /// Reference values (Wilson 1927; e.g. R's `prop.test(k, n, correct = FALSE)$conf.int`,
    /// statsmodels `proportion_confint(k, n, method="wilson")`).
    #[test]
    fn wilson_interval_matches_reference_values() {
        assert!(close(wilson(2, 8), (0.0715, 0.5907)), "{:?}", wilson(2, 8));
        assert!(close(wilson(0, 8), (0.0, 0.3244)), "{:?}", wilson(0, 8));
        assert!(close(wilson(8, 8), (0.6756, 1.0)), "{:?}", wilson(8, 8));
        assert!(close(wilson(5, 10), (0.2366, 0.7634)), "{:?}", wilson(5, 10));
        assert!(close(wilson(1, 1), (0.2065, 1.0)), "{:?}", wilson(1, 1));
        assert_eq!(wilson(0, 0), (0.0, 1.0));
        // Symmetric, contains the point estimate, narrows with more runs.
        for n in 1..60 {
            for k in 0..=n {
                let (lo, hi) = wilson(k, n);
                let (lo2, hi2) = wilson(n - k, n);
                assert!((lo - (1.0 - hi2)).abs() < 1e-9 && (hi - (1.0 - lo2)).abs() < 1e-9, "{k}/{n}");
                let p = k as f64 / n as f64;
                assert!(lo <= p + 1e-12 && p <= hi + 1e-12, "{k}/{n}: {lo}–{hi}");
            }
        }
        let w = |k, n| {
            let (lo, hi) = wilson(k, n);
            hi - lo
        };
        assert!(w(25, 100) < w(5, 20) && w(5, 20) < w(2, 8));
        assert_eq!(describe(2, 8), "2 of 8 (25%), 95% interval 7–59%");
        assert_eq!(describe(1, 1), "1 of 1 (100%), 95% interval 21–100%");
    }

    #[test]
    fn runs_to_catch_follows_the_formula_capped_and_floored() {
        // ceil(ln 0.05 / ln(1 - p))
        assert_eq!(runs_to_catch(0.25, 1, 20), 11);
        assert_eq!(runs_to_catch(0.5, 1, 20), 5);
        assert_eq!(runs_to_catch(0.95, 1, 20), 1);
        assert_eq!(runs_to_catch(0.9, 1, 20), 2);
        assert_eq!(runs_to_catch(2.0 / 3.0, 1, 20), 3);
        // Capped: 1 in 20 would need 59.
        assert_eq!(runs_to_catch(0.05, 1, 20), 20);
        assert_eq!(runs_to_catch(0.05, 1, 100), 59);
        // Never below --times.
        assert_eq!(runs_to_catch(0.5, 8, 20), 8);
        assert_eq!(runs_to_catch(0.01, 30, 20), 30);
        // Not timing-bound / no information.
        assert_eq!(runs_to_catch(1.0, 1, 20), 1);
        assert_eq!(runs_to_catch(1.0, 3, 20), 3);
        assert_eq!(runs_to_catch(0.0, 1, 20), 20);
        assert_eq!(runs_to_catch(f64::NAN, 1, 20), 20);
        // The miss probability at the chosen n is at most 5% whenever the cap does not bind.
        for i in 1..100 {
            let p = i as f64 / 100.0;
            let n = runs_to_catch(p, 1, 1000);
            assert!((1.0 - p).powi(n as i32) <= 0.05 + 1e-12, "p {p}: n {n}");
            assert!(n == 1 || (1.0 - p).powi(n as i32 - 1) > 0.05, "p {p}: n {n} is not the least");
        }
    }
}
