//! The speed gate: `ci/speed.toml`'s limits, and every ratio's 95% interval held to them (`lockstep gate
//! --speed`) — never an absolute time, which differs between machines and days.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::file::{read_capped, validate_bench, MAX_SPEED_LIMITS_BYTES};
use super::stats::{comparisons, double_ratio};
use super::{BenchReport, BenchResult, Test};

/// The speed gate's limits (`ci/speed.toml`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedLimits {
    /// Against a baseline lockstep (interleaved in the same bench, or another bench.json normalised by
    /// its own llama.cpp): fail when the interval's upper end is below `1 − max_slowdown`.
    pub max_slowdown: f64,
    /// Against llama.cpp in the same bench: fail when the interval's upper end is below this.
    pub min_ratio_to_llama_cpp: f64,
    /// Against the speed floors (`--speed-floors`, [`super::floors`]): fail when the interval's upper end
    /// of the row's share of the machine over its floor is below `1 − max_slowdown_vs_floors`. Wider than
    /// `max_slowdown`: the floors come from another machine and day.
    pub max_slowdown_vs_floors: f64,
}

impl SpeedLimits {
    /// Read `ci/speed.toml`: at most [`MAX_SPEED_LIMITS_BYTES`] of a regular file, parsed and checked by
    /// [`parse_speed_limits`]. Errors name the file.
    pub fn load(path: &Path) -> Result<SpeedLimits> {
        let text = read_capped(path, MAX_SPEED_LIMITS_BYTES, "speed limits file")?;
        parse_speed_limits(&text, path)
    }

    /// Check that every limit is finite and in range: `max_slowdown` and `max_slowdown_vs_floors` in
    /// [0, 1) (the limits `1 − max_slowdown…` stay above 0, so a check can fail), `min_ratio_to_llama_cpp` in (0, 1000]
    /// (0 would pass any speed). Errors name the field and its value.
    pub fn validate(&self) -> Result<()> {
        let m = self.max_slowdown;
        if !(m.is_finite() && (0.0..1.0).contains(&m)) {
            bail!(
                "max_slowdown: {m:?} is not in [0, 1) (a fraction of the baseline's speed; 1 or more would \
                 pass any slowdown)"
            );
        }
        let m = self.max_slowdown_vs_floors;
        if !(m.is_finite() && (0.0..1.0).contains(&m)) {
            bail!(
                "max_slowdown_vs_floors: {m:?} is not in [0, 1) (a fraction of the floor; 1 or more would \
                 pass any slowdown)"
            );
        }
        let r = self.min_ratio_to_llama_cpp;
        if !(r.is_finite() && r > 0.0 && r <= 1000.0) {
            bail!(
                "min_ratio_to_llama_cpp: {r:?} is not in (0, 1000] (lockstep/llama.cpp tokens/s; 0 would \
                 pass any speed)"
            );
        }
        Ok(())
    }
}

/// Parse and check the text of a speed limits file (`ci/speed.toml`); `path` only names the file in
/// errors (no I/O).
///
/// Errors, each naming `path`: not TOML; an unknown key, a missing key, a value that is not a number;
/// a limit out of range or not finite (`nan`, `inf`) ([`SpeedLimits::validate`]).
pub fn parse_speed_limits(text: &str, path: &Path) -> Result<SpeedLimits> {
    let l: SpeedLimits = toml::from_str(text)
        .with_context(|| format!("{} is not a speed limits file", path.display()))?;
    l.validate()
        .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
    Ok(l)
}

/// One line of the speed gate.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeedCheck {
    /// Model and test.
    pub what: String,
    /// `lockstep / llama.cpp`, `lockstep / baseline`, or `(lockstep / llama.cpp) / (baseline file's)`.
    pub against: String,
    /// Ratio and its 95% interval.
    pub ratio: (f64, f64, f64),
    /// The limit the interval's upper end must reach.
    pub limit: f64,
    /// Passed.
    pub pass: bool,
}

impl SpeedCheck {
    /// The line `lockstep gate --speed` prints: `PASS`/`FAIL`, what, the ratio with its 95% interval, the
    /// limit.
    pub fn line(&self) -> String {
        let (ratio, lo, hi) = self.ratio;
        let verdict = if self.pass { "PASS" } else { "FAIL" };
        format!(
            "{verdict} {}: {} = {ratio:.3} [95% {lo:.3}, {hi:.3}], limit {:.3} (fails when the interval's upper end is below it)",
            self.what, self.against, self.limit
        )
    }
}

/// The speed gate. Checks, per model and test, every ratio recomputed from the samples (the recorded
/// `comparisons` are never trusted; [`validate_bench`] refuses a file whose recorded ones differ):
/// - lockstep against every other engine of `bench` ([`comparisons`]; against llama.cpp:
///   `min_ratio_to_llama_cpp`; against an interleaved baseline: `1 − max_slowdown`);
/// - with `baseline_file`: the ratio of `lockstep / llama.cpp` in `bench` to the same ratio in the
///   baseline file (each run normalised by its own llama.cpp, so the two runs may come from different
///   moments of a noisy machine), bootstrapped over all four sample sets, against `1 − max_slowdown`.
///
/// A check fails when the upper end of the 95% interval is below its limit: a slowdown the repetitions'
/// spread cannot explain.
///
/// Errors: either report invalid ([`validate_bench`]: empty results, non-finite, zero or negative samples,
/// ...), the limits out of range ([`SpeedLimits::validate`]); with a baseline file, a model and test of
/// either file missing from the other (no check is dropped), or without llama.cpp rows.
pub fn gate_speed(
    bench: &BenchReport,
    baseline_file: Option<&BenchReport>,
    limits: &SpeedLimits,
) -> Result<Vec<SpeedCheck>> {
    validate_bench(bench).context("the current bench")?;
    if let Some(b) = baseline_file {
        validate_bench(b).context("the baseline bench")?;
    }
    limits.validate()?;
    let mut checks = Vec::new();
    for c in comparisons(&bench.results) {
        let limit = if c.denominator == "llama.cpp" {
            limits.min_ratio_to_llama_cpp
        } else {
            1.0 - limits.max_slowdown
        };
        checks.push(SpeedCheck {
            what: format!("{} {}", c.model, c.test),
            against: format!("{} / {}", c.numerator, c.denominator),
            ratio: (c.ratio, c.ci_low, c.ci_high),
            limit,
            pass: c.ci_high >= limit,
        });
    }
    if let Some(base) = baseline_file {
        let (cur, old) = (row_index(bench), row_index(base));
        let find = |i: &RowIndex<'_>, engine: &str, model: &str, test: Test| {
            i.get(&(engine, model, test)).map(|x| x.samples_ts.clone())
        };
        // every test the baseline holds must be checked again: a current bench that lost one would
        // silently drop its check
        for y in base.results.iter().filter(|y| y.engine == "lockstep") {
            if find(&cur, "lockstep", &y.model, Test::of(y)).is_none() {
                bail!(
                    "the current bench has no lockstep row for {} {}, which the baseline bench has (every \
                     test of the baseline is checked)",
                    y.model,
                    Test::of(y).name()
                );
            }
        }
        for x in bench.results.iter().filter(|x| x.engine == "lockstep") {
            let test = Test::of(x);
            let name = test.name();
            let get = |i: &RowIndex<'_>, e: &str, which: &str| {
                find(i, e, &x.model, test).with_context(|| {
                    format!("the {which} bench has no {e} row for {} {name}", x.model)
                })
            };
            let (a, la) = (x.samples_ts.clone(), get(&cur, "llama.cpp", "current")?);
            let (b, lb) = (
                get(&old, "lockstep", "baseline")?,
                get(&old, "llama.cpp", "baseline")?,
            );
            let ratio = double_ratio(&a, &la, &b, &lb, 2000);
            let limit = 1.0 - limits.max_slowdown;
            checks.push(SpeedCheck {
                what: format!("{} {name}", x.model),
                against: "(lockstep / llama.cpp) ÷ baseline file's".into(),
                ratio,
                limit,
                pass: ratio.2 >= limit,
            });
        }
    }
    Ok(checks)
}

/// A report's rows by engine, model and test.
pub(crate) type RowIndex<'a> = std::collections::HashMap<(&'a str, &'a str, Test), &'a BenchResult>;

pub(crate) fn row_index(r: &BenchReport) -> RowIndex<'_> {
    r.results
        .iter()
        .map(|x| ((x.engine.as_str(), x.model.as_str(), Test::of(x)), x))
        .collect()
}
