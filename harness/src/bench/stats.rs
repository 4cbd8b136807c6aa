//! Statistics of the samples: median, mean and standard deviation, tokens per second, the
//! percentile-bootstrap interval of a ratio of medians, and the comparisons of ours against every other
//! engine.

use super::{BenchResult, Comparison, Test};

/// Median of a non-empty slice (mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub(crate) fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Ratio of medians `median(a) / median(b)` with a 95% percentile-bootstrap interval: `resamples` times,
/// draw `a.len()` values from `a` and `b.len()` from `b` with replacement and take the ratio of medians;
/// the interval is the 2.5th and 97.5th percentiles. Deterministic (xorshift, fixed seed).
///
/// Returns `(ratio, low, high)`; NaNs when either side is empty.
pub fn bootstrap_ratio(a: &[f64], b: &[f64], resamples: usize) -> (f64, f64, f64) {
    if a.is_empty() || b.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut ratios = Vec::with_capacity(resamples);
    let (mut ra, mut rb) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    for _ in 0..resamples {
        for x in ra.iter_mut() {
            *x = a[next(a.len())];
        }
        for x in rb.iter_mut() {
            *x = b[next(b.len())];
        }
        ratios.push(median(&ra) / median(&rb));
    }
    ratios.sort_by(f64::total_cmp);
    let pick = |q: f64| ratios[((q * resamples as f64) as usize).min(resamples - 1)];
    (median(a) / median(b), pick(0.025), pick(0.975))
}

/// Tokens/s of one sample of `ns` nanoseconds of `test` (`n_tokens / (ns · 1e-9)`).
pub(crate) fn tokens_per_second(test: Test, ns: u64) -> f64 {
    test.n_tokens() as f64 / (ns as f64 * 1e-9)
}

/// lockstep against every other engine, per model and test: for each `lockstep` row of `results` (in
/// order), one [`Comparison`] with each other engine's row of the same model and test (in order), the
/// ratio of median tokens/s and its [`bootstrap_ratio`] interval (2000 resamples) — what `bench.json`
/// records and what the speed gate recomputes from the samples.
pub fn comparisons(results: &[BenchResult]) -> Vec<Comparison> {
    // the other engines' rows by model and test, in order (one pass: a hostile file of many rows
    // costs linear time)
    let mut others: std::collections::HashMap<(&str, Test), Vec<&BenchResult>> =
        std::collections::HashMap::new();
    for y in results.iter().filter(|y| y.engine != "lockstep") {
        others
            .entry((y.model.as_str(), Test::of(y)))
            .or_default()
            .push(y);
    }
    let mut out = Vec::new();
    for x in results.iter().filter(|x| x.engine == "lockstep") {
        let test = Test::of(x);
        for y in others
            .get(&(x.model.as_str(), test))
            .map_or(&[][..], Vec::as_slice)
        {
            let (ratio, ci_low, ci_high) = bootstrap_ratio(&x.samples_ts, &y.samples_ts, 2000);
            out.push(Comparison {
                model: x.model.clone(),
                test: test.name(),
                numerator: x.engine.clone(),
                denominator: y.engine.clone(),
                ratio,
                ci_low,
                ci_high,
            });
        }
    }
    out
}

/// `(m(a)/m(la)) / (m(b)/m(lb))` (m = median) with a 95% percentile-bootstrap interval over the four
/// sample sets, as [`bootstrap_ratio`].
pub fn double_ratio(
    a: &[f64],
    la: &[f64],
    b: &[f64],
    lb: &[f64],
    resamples: usize,
) -> (f64, f64, f64) {
    let mut s = 0x853c_49e6_748f_ea9bu64;
    let mut next = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut draw = |v: &[f64]| -> f64 {
        let r: Vec<f64> = (0..v.len()).map(|_| v[next(v.len())]).collect();
        median(&r)
    };
    let mut ratios: Vec<f64> = (0..resamples)
        .map(|_| (draw(a) / draw(la)) / (draw(b) / draw(lb)))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let pick = |q: f64| ratios[((q * resamples as f64) as usize).min(resamples - 1)];
    (
        (median(a) / median(la)) / (median(b) / median(lb)),
        pick(0.025),
        pick(0.975),
    )
}
