//! The thresholds of `ci/thresholds.toml`: parsed, checked and merged into one cell's thresholds.
//!
//! # Thresholds file
//!
//! ```toml
//! [[rule]]
//! model = "*"            # selectors: an exact value or "*" (a missing selector is "*")
//! mode = "*"
//! oracle = "*"
//! tokens_must_match = true
//! min_top1_agreement = 1.0
//! max_mean_kl = 1e-3
//! # max_kl = 1e-2       # optional
//! min_top5_mean = 0.9
//! min_cosine_out = 0.9999
//! stage_min_cosine = 0.999
//! margin_tolerance = 0.01
//!
//! [[rule]]
//! mode = "reference"
//! max_mean_kl = 5e-3     # overrides the field above for reference-mode cells
//! ```
//!
//! Every rule whose selectors all match a cell applies, in file order, and a later rule overrides an
//! earlier one **field by field**: the first rule usually sets every field for every cell, later rules
//! change a few. After merging, every field but `max_kl` must be set. A cell no rule matches is an error.
//!
//! # What each threshold checks (see [`evaluate`])
//!
//! - `tokens_must_match`: the engine's tokenization of the prompt equals the oracle's.
//! - `min_top1_agreement`: (positions whose top-1 tokens agree + near ties) / positions, over the prefill
//!   and decode logits together. A near tie is a disagreement whose reference margin (reference logit of
//!   its top-1 − its logit of the engine's top-1) is below `margin_tolerance` (logit units).
//! - `max_mean_kl`: mean of KL(P_ref ‖ P_eng) (nats) over every position with a full reference row.
//! - `max_kl`: largest KL at any such position.
//! - `min_top5_mean`: mean top-5 overlap over every position.
//! - `min_cosine_out`: smallest cosine at any position (prefill and decode) of every `blk.N.out` and of
//!   `output_norm`.
//! - `stage_min_cosine`: not a pass/fail threshold: the cosine below which a stage counts as divergent
//!   for [`first_divergent`], which the verdict and the failure line report.
//! - `stage_exact` (optional, default false): every compared stage must equal the golden at its storage
//!   precision; the first stage that does not is the first divergent one ([`first_inexact`]). For a mode
//!   that reproduces the oracle bit for bit, bit equality *is* the measured floor.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::matrix::Cell;

/// The wildcard selector.
pub const ANY: &str = "*";

fn any() -> String {
    ANY.to_string()
}

/// One `[[rule]]` of the thresholds file: selectors and the fields it sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Model id, or `*`.
    #[serde(default = "any")]
    pub model: String,
    /// Numerics mode, or `*`.
    #[serde(default = "any")]
    pub mode: String,
    /// Oracle (golden directory name), or `*`.
    #[serde(default = "any")]
    pub oracle: String,
    /// Free text: why this rule exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// See [`CellThresholds::yardstick`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yardstick: Option<String>,
    /// See [`CellThresholds::tokens_must_match`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_must_match: Option<bool>,
    /// See [`CellThresholds::min_top1_agreement`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_top1_agreement: Option<f64>,
    /// See [`CellThresholds::max_mean_kl`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mean_kl: Option<f64>,
    /// See [`CellThresholds::max_kl`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kl: Option<f64>,
    /// See [`CellThresholds::min_top5_mean`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_top5_mean: Option<f64>,
    /// See [`CellThresholds::min_cosine_out`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cosine_out: Option<f64>,
    /// See [`CellThresholds::stage_min_cosine`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_min_cosine: Option<f64>,
    /// See [`CellThresholds::margin_tolerance`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_tolerance: Option<f64>,
    /// See [`CellThresholds::stage_max_nmse`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_max_nmse: Option<f64>,
    /// See [`CellThresholds::stage_exact`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_exact: Option<bool>,
    /// See [`CellThresholds::stage_floor_headroom`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_floor_headroom: Option<f64>,
}

impl Rule {
    fn matches(&self, cell: &Cell) -> bool {
        let sel = |s: &str, v: &str| s == ANY || s == v;
        // the Hugging Face copy of a registered model is held to its source's rules (the same weights)
        (sel(&self.model, &cell.model)
            || self.model == crate::registry::Registry::golden_model_of(&cell.model))
            && sel(&self.mode, cell.mode.name())
            && sel(&self.oracle, &cell.oracle)
    }
}

/// `ci/thresholds.toml`: an ordered list of rules.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// The rules, in file order (`[[rule]]`).
    #[serde(rename = "rule")]
    pub rules: Vec<Rule>,
    /// Where the rules came from (a path), for error messages.
    #[serde(skip)]
    pub origin: String,
}

/// The thresholds that hold for one cell, after merging every matching rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellThresholds {
    /// The engine must tokenize the prompt exactly as the oracle did.
    pub tokens_must_match: bool,
    /// Minimum fraction (0..=1) of logits positions, prefill and decode together, whose top-1 tokens
    /// agree; near ties (margin below `margin_tolerance`) count as agreeing.
    pub min_top1_agreement: f64,
    /// Maximum mean KL(P_ref ‖ P_eng), nats, over the positions with full reference rows.
    pub max_mean_kl: f64,
    /// Maximum KL at any single position, nats; `None`: not checked.
    pub max_kl: Option<f64>,
    /// Minimum mean top-5 overlap (0..=1) over all logits positions.
    pub min_top5_mean: f64,
    /// Minimum cosine at any position, prefill and decode, of every `blk.N.out` and `output_norm`.
    pub min_cosine_out: f64,
    /// A stage whose cosine at some position falls below this counts as divergent ([`first_divergent`]).
    pub stage_min_cosine: f64,
    /// A stage whose NMSE at some position rises above this counts as divergent too; `None`: cosine only.
    /// Cosine is blind to scale: a wrong RMSNorm epsilon rescales a whole row and keeps its cosine at 1,
    /// while its NMSE jumps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_max_nmse: Option<f64>,
    /// A top-1 disagreement whose reference margin is below this (logit units) is a near tie.
    pub margin_tolerance: f64,
    /// The floor of a mode that reproduces the oracle bit for bit: every compared stage must equal the
    /// golden at the golden's storage precision (the engine's f32 rounded to f16 where the golden stores
    /// f16). A stage that does not fails the cell (`stage_exact`), and the first such stage in forward
    /// order is the first divergent one — however small its NMSE. `false`: the cosine/NMSE cutoffs.
    #[serde(default)]
    pub stage_exact: bool,
    /// Where the floor is measured (`ci/floors.json`, [`crate::floors`]) rather than bit equality: a stage's
    /// local error (bisect's injected pass) counts as above the floor beyond this many times the measured
    /// 99th percentile of its kind. `None`: no measured floors; the cutoffs above serve. A rule sets
    /// `stage_floor_headroom = 0.0` to switch an earlier rule's floors off for its cells (`None` here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_floor_headroom: Option<f64>,
    /// The yardstick the cell is held to, in a few words (the last matching rule's `yardstick`): bit
    /// equality with llama.cpp, the f32-vs-f64 floor, llama.cpp's own F16-KV noise floor, or the measured
    /// cross-oracle distance ([`super::yardstick`]). report.md names it per cell. Empty in reports written
    /// before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub yardstick: String,
}

/// The largest `stage_floor_headroom`: the measured 99th percentiles reach NMSE ~1e-2 (ci/floors.json), so
/// a larger multiple puts the floor near NMSE 1, where any output, even all zeros, is "within the floor".
pub const MAX_FLOOR_HEADROOM: f64 = 100.0;

/// The allowed range of one numeric field of a [`Rule`].
#[derive(Clone, Copy, Debug)]
pub struct ThresholdRange {
    /// The field's name in the file.
    pub name: &'static str,
    /// The field of a rule.
    pub get: fn(&Rule) -> Option<f64>,
    /// Lower bound, and whether it is excluded.
    pub lo: (f64, bool),
    /// Upper bound, and whether it is excluded.
    pub hi: (f64, bool),
    /// Unit or reason, printed after the range.
    pub note: &'static str,
}

impl ThresholdRange {
    /// True for a finite value within the range.
    pub fn contains(&self, x: f64) -> bool {
        let above = if self.lo.1 {
            x > self.lo.0
        } else {
            x >= self.lo.0
        };
        let below = if self.hi.1 {
            x < self.hi.0
        } else {
            x <= self.hi.0
        };
        x.is_finite() && above && below
    }
}

impl std::fmt::Display for ThresholdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "{}{}, {}{}{}",
            if self.lo.1 { "(" } else { "[" },
            self.lo.0,
            self.hi.0,
            if self.hi.1 { ")" } else { "]" },
            self.note
        )
    }
}

const fn range(
    name: &'static str,
    get: fn(&Rule) -> Option<f64>,
    lo: (f64, bool),
    hi: (f64, bool),
    note: &'static str,
) -> ThresholdRange {
    ThresholdRange {
        name,
        get,
        lo,
        hi,
        note,
    }
}

/// The range of every numeric threshold but `stage_floor_headroom` ([`MAX_FLOOR_HEADROOM`]): a value
/// outside it is refused, because it makes its check vacuous (passes everything) or meaningless. NaN
/// and ±Inf are outside every range.
///
/// - fractions `min_top1_agreement`, `min_top5_mean`: (0, 1] (0 passes everything);
/// - cosines `min_cosine_out`, `stage_min_cosine`: (0, 1] (at 0 or below, unrelated output passes);
/// - KL `max_mean_kl`, `max_kl`: [0, 10] nats (a one-hot reference against a uniform distribution over a
///   49k vocabulary is KL ~10.8: a limit near that passes an engine that knows nothing);
/// - `margin_tolerance`: [0, 10] logit units (a probability ratio of e^10 ≈ 22000 is no tie);
/// - `stage_max_nmse`: [0, 1) (a zero output has NMSE 1).
pub const THRESHOLD_RANGES: [ThresholdRange; 8] = [
    range(
        "min_top1_agreement",
        |r| r.min_top1_agreement,
        (0.0, true),
        (1.0, false),
        "",
    ),
    range(
        "min_top5_mean",
        |r| r.min_top5_mean,
        (0.0, true),
        (1.0, false),
        "",
    ),
    range(
        "min_cosine_out",
        |r| r.min_cosine_out,
        (0.0, true),
        (1.0, false),
        "",
    ),
    range(
        "stage_min_cosine",
        |r| r.stage_min_cosine,
        (0.0, true),
        (1.0, false),
        "",
    ),
    range(
        "max_mean_kl",
        |r| r.max_mean_kl,
        (0.0, false),
        (10.0, false),
        " nats",
    ),
    range("max_kl", |r| r.max_kl, (0.0, false), (10.0, false), " nats"),
    range(
        "margin_tolerance",
        |r| r.margin_tolerance,
        (0.0, false),
        (10.0, false),
        " logit units",
    ),
    range(
        "stage_max_nmse",
        |r| r.stage_max_nmse,
        (0.0, false),
        (1.0, true),
        " (a zero output has NMSE 1)",
    ),
];

impl Thresholds {
    /// Read and parse a thresholds file.
    pub fn load(path: &Path) -> Result<Thresholds> {
        let text =
            crate::input::read_string(path, "the thresholds file", crate::input::MAX_CONFIG_BYTES)?;
        Thresholds::parse(&text, &path.display().to_string())
    }

    /// Parse and check thresholds TOML; `origin` names the source in errors. Pure: no I/O.
    ///
    /// Errors, naming `origin` and the rule (index and selectors) and field: bad TOML, an unknown or
    /// duplicated key, no `[[rule]]`, an empty selector or one with surrounding whitespace, a `mode`
    /// selector that is neither `*` nor a numerics mode, and a number outside its range
    /// ([`THRESHOLD_RANGES`]; NaN and ±Inf are outside every range). `stage_floor_headroom` is 0 (no
    /// measured floors) or in [1, 100].
    pub fn parse(text: &str, origin: &str) -> Result<Thresholds> {
        let mut t: Thresholds = toml::from_str(text)
            .with_context(|| format!("{origin} is not a valid thresholds file"))?;
        t.origin = origin.to_string();
        if t.rules.is_empty() {
            bail!("{origin}: no [[rule]]");
        }
        for (i, r) in t.rules.iter().enumerate() {
            let at = format!(
                "{origin}: rule {} (model {:?}, mode {:?}, oracle {:?})",
                i + 1,
                r.model,
                r.mode,
                r.oracle
            );
            for (name, s) in [
                ("model", &r.model),
                ("mode", &r.mode),
                ("oracle", &r.oracle),
            ] {
                if s.trim().is_empty() {
                    bail!("{at}: selector `{name}` is empty; use \"*\" for any");
                }
                if s.trim() != s {
                    bail!("{at}: selector `{name}` {s:?} has surrounding whitespace and matches no cell");
                }
            }
            if r.yardstick.as_deref().is_some_and(|y| y.trim().is_empty()) {
                bail!("{at}: `yardstick` is empty; name what the rule holds cells to, or leave it out");
            }
            if r.mode != ANY && r.mode.parse::<lockstep_engine::NumericsMode>().is_err() {
                bail!(
                    "{at}: selector `mode` {:?} is not a numerics mode (reference, ggml) or \"*\"; \
                     the rule would match no cell",
                    r.mode
                );
            }
            for range in &THRESHOLD_RANGES {
                if let Some(x) = (range.get)(r) {
                    if !range.contains(x) {
                        bail!("{at}: {} = {x:?} is outside {range}", range.name);
                    }
                }
            }
            if let Some(h) = r.stage_floor_headroom {
                if !(h == 0.0 || (1.0..=MAX_FLOOR_HEADROOM).contains(&h)) {
                    bail!(
                        "{at}: stage_floor_headroom = {h:?} is neither 0 (no measured floors) nor in \
                         [1, {MAX_FLOOR_HEADROOM}] (below 1 the unbroken engine's own rows exceed its floor; \
                         above {MAX_FLOOR_HEADROOM} the floor hides errors of structural size)"
                    );
                }
            }
        }
        Ok(t)
    }

    /// Check the rules against the whole matrix, not just the cells a run selects: every (model, mode,
    /// oracle) the matrix holds must get a complete set of thresholds ([`Thresholds::for_cell`]).
    /// Errors list every combination that does not, naming this file.
    pub fn validate_matrix(&self, matrix: &crate::matrix::Matrix) -> Result<()> {
        let mut errors = Vec::new();
        for m in &matrix.models {
            for mode in &matrix.modes {
                for oracle in matrix.oracles.iter().filter(|o| m.has_oracle(o)) {
                    let Ok(mode) = mode.parse() else {
                        continue; // the matrix refused it on load (`check_axis` against MODES)
                    };
                    let cell = Cell {
                        model: m.id.clone(),
                        prompt: "*".into(),
                        quant: m.quant.clone(),
                        mode,
                        simd: matrix.simd.first().cloned().unwrap_or_default(),
                        oracle: oracle.clone(),
                        engine: matrix.engines.first().cloned().unwrap_or_default(),
                    };
                    if let Err(e) = self.for_cell(&cell) {
                        errors.push(format!("{e:#}"));
                    }
                }
            }
        }
        if !errors.is_empty() {
            bail!(
                "{} does not cover the whole matrix:\n  {}",
                self.origin,
                errors.join("\n  ")
            );
        }
        Ok(())
    }

    /// Merge every rule matching `cell`, in order, field by field. Errors when no rule matches or a
    /// required field stays unset.
    pub fn for_cell(&self, cell: &Cell) -> Result<CellThresholds> {
        let matching: Vec<&Rule> = self.rules.iter().filter(|r| r.matches(cell)).collect();
        if matching.is_empty() {
            bail!(
                "{}: no rule matches cell {} (model {}, mode {}, oracle {}); add a rule with model/mode/oracle \"*\"",
                self.origin,
                cell.id(),
                cell.model,
                cell.mode,
                cell.oracle
            );
        }
        let last = |f: fn(&Rule) -> Option<f64>| matching.iter().rev().find_map(|r| f(r));
        let need = |name: &str, v: Option<f64>| {
            v.ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: the rules matching cell {} leave `{name}` unset",
                    self.origin,
                    cell.id()
                )
            })
        };
        Ok(CellThresholds {
            tokens_must_match: matching
                .iter()
                .rev()
                .find_map(|r| r.tokens_must_match)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: the rules matching cell {} leave `tokens_must_match` unset",
                        self.origin,
                        cell.id()
                    )
                })?,
            min_top1_agreement: need("min_top1_agreement", last(|r| r.min_top1_agreement))?,
            max_mean_kl: need("max_mean_kl", last(|r| r.max_mean_kl))?,
            max_kl: last(|r| r.max_kl),
            min_top5_mean: need("min_top5_mean", last(|r| r.min_top5_mean))?,
            min_cosine_out: need("min_cosine_out", last(|r| r.min_cosine_out))?,
            stage_min_cosine: need("stage_min_cosine", last(|r| r.stage_min_cosine))?,
            margin_tolerance: need("margin_tolerance", last(|r| r.margin_tolerance))?,
            stage_max_nmse: last(|r| r.stage_max_nmse),
            stage_exact: matching
                .iter()
                .rev()
                .find_map(|r| r.stage_exact)
                .unwrap_or(false),
            // 0 = "no measured floors" (a later rule cannot unset a field, so it sets 0)
            stage_floor_headroom: last(|r| r.stage_floor_headroom).filter(|&h| h > 0.0),
            yardstick: matching
                .iter()
                .rev()
                .find_map(|r| r.yardstick.clone())
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A complete rule for every cell, then `extra` as a second rule for reference mode.
    fn with(extra: &str) -> String {
        format!(
            "[[rule]]\ntokens_must_match = true\nmin_top1_agreement = 1.0\nmax_mean_kl = 1e-3\n\
             min_top5_mean = 0.9\nmin_cosine_out = 0.9999\nstage_min_cosine = 0.999\n\
             margin_tolerance = 0.01\n\n[[rule]]\nmode = \"reference\"\n{extra}\n"
        )
    }

    fn refused(extra: &str) -> String {
        let e = Thresholds::parse(&with(extra), "ci/thresholds.toml")
            .expect_err(&format!("accepted {extra:?}"));
        format!("{e:#}")
    }

    #[test]
    fn every_threshold_is_finite_and_in_its_range() {
        let at = "ci/thresholds.toml: rule 2 (model \"*\", mode \"reference\", oracle \"*\")";
        for (extra, needle) in [
            ("stage_floor_headroom = nan", "stage_floor_headroom = NaN"),
            ("stage_floor_headroom = inf", "stage_floor_headroom = inf"),
            ("stage_floor_headroom = -inf", "stage_floor_headroom = -inf"),
            ("stage_floor_headroom = -4.0", "stage_floor_headroom = -4.0"),
            ("stage_floor_headroom = 0.5", "stage_floor_headroom = 0.5"),
            (
                "stage_floor_headroom = 1e308",
                "stage_floor_headroom = 1e308",
            ),
            (
                "stage_floor_headroom = 101.0",
                "stage_floor_headroom = 101.0",
            ),
            ("max_mean_kl = nan", "max_mean_kl = NaN"),
            ("max_mean_kl = inf", "max_mean_kl = inf"),
            (
                "max_mean_kl = 1e308",
                "max_mean_kl = 1e308 is outside [0, 10] nats",
            ),
            ("max_kl = -1e-3", "max_kl = -0.001"),
            ("margin_tolerance = 1e308", "margin_tolerance = 1e308"),
            ("margin_tolerance = nan", "margin_tolerance = NaN"),
            (
                "stage_max_nmse = 1.0",
                "stage_max_nmse = 1.0 is outside [0, 1)",
            ),
            ("stage_max_nmse = inf", "stage_max_nmse = inf"),
            (
                "min_cosine_out = -1.0",
                "min_cosine_out = -1.0 is outside (0, 1]",
            ),
            ("min_cosine_out = nan", "min_cosine_out = NaN"),
            ("stage_min_cosine = 0.0", "stage_min_cosine = 0.0"),
            ("min_top1_agreement = 0.0", "min_top1_agreement = 0.0"),
            ("min_top5_mean = 1.5", "min_top5_mean = 1.5"),
            ("min_top5_mean = nan", "min_top5_mean = NaN"),
        ] {
            let e = refused(extra);
            assert!(e.contains(at) && e.contains(needle), "{extra}: {e}");
        }
        // 0 is the documented "no measured floors" of a later rule; 1 and 100 are the range's ends
        for ok in [
            "stage_floor_headroom = 0.0",
            "stage_floor_headroom = 1.0",
            "stage_floor_headroom = 100.0",
            "stage_max_nmse = 0.0",
            "max_mean_kl = 0.0",
        ] {
            Thresholds::parse(&with(ok), "t.toml").unwrap_or_else(|e| panic!("{ok}: {e:#}"));
        }
    }

    #[test]
    fn unknown_keys_and_selectors_are_refused() {
        for (extra, needle) in [
            ("stage_floor_headrom = 4.0", "stage_floor_headrom"),
            ("[rule.sub]\nx = 1", "sub"),
            ("oracle = \" llama.cpp-f32kv\"", "surrounding whitespace"),
            (
                "max_mean_kl = 1e-3\nmax_mean_kl = 2e-3",
                "ci/thresholds.toml",
            ),
        ] {
            let e = refused(extra);
            assert!(e.contains(needle), "{extra}: {e}");
        }
        let e = format!(
            "{:#}",
            Thresholds::parse(
                &with("").replace("mode = \"reference\"", "mode = \"refrence\""),
                "t.toml"
            )
            .unwrap_err()
        );
        assert!(
            e.contains("t.toml: rule 2")
                && e.contains("`mode` \"refrence\" is not a numerics mode"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            Thresholds::parse(&format!("{}\nbogus = 1\n", with("")), "t.toml").unwrap_err()
        );
        assert!(e.contains("t.toml") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn the_committed_thresholds_pass_their_checks() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/thresholds.toml");
        Thresholds::load(&p).unwrap_or_else(|e| panic!("{e:#}"));
    }
}
