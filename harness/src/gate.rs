//! Gates: the thresholds of `ci/thresholds.toml`, the verdict of one cell, and the one-line reasons
//! `lockstep gate` prints for failing cells.
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

use crate::compare::{CellComparison, Phase};
use crate::format::{fmt_fixed, fmt_sci};
use crate::matrix::Cell;
use crate::metrics::LogitPosition;

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
        sel(&self.model, &cell.model)
            && sel(&self.mode, &cell.mode)
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
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{} cannot be read", path.display()))?;
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
                    let cell = Cell {
                        model: m.id.clone(),
                        prompt: "*".into(),
                        quant: m.quant.clone(),
                        mode: mode.clone(),
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
        })
    }
}

/// The verdict on one cell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// True when no threshold failed.
    pub pass: bool,
    /// Every threshold that failed.
    pub failures: Vec<Failure>,
    /// The first stage in forward order whose cosine falls below `stage_min_cosine` (informative; not a
    /// failure by itself).
    pub first_divergent: Option<Divergence>,
    /// The near-tie tolerance (logit units) this verdict counted top-1 disagreements with: the cell's
    /// `margin_tolerance` (reports of older versions lack it and read as 0.01, the value they all used).
    #[serde(default = "default_margin_tolerance")]
    pub margin_tolerance: f64,
}

fn default_margin_tolerance() -> f64 {
    0.01
}

/// One threshold that failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Metric name: `tokens_match`, `top1_agreement`, `mean_kl`, `max_kl`, `top5_mean` or
    /// `min_cosine_out`.
    pub metric: String,
    /// Measured value (NaN when the metric could not be measured at all).
    pub value: f64,
    /// The threshold it failed (a minimum or a maximum, by metric).
    pub threshold: f64,
    /// Where and why, e.g. `prefill position 13, ref top 909 vs engine 198 (margin 0.53)`.
    pub detail: String,
}

/// Where a stage first falls below the divergence cosine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// Canonical stage id.
    pub stage: String,
    /// Prefill or decode.
    pub phase: Phase,
    /// Sequence position: prompt position in the prefill; T + step for decode step `step` (T = prompt
    /// tokens), as for logits.
    pub position: usize,
    /// Cosine at that position.
    pub cosine: f64,
    /// NMSE at that position (may be +∞ when the reference row is zero).
    pub nmse: f64,
}

/// A logits position with its phase.
#[derive(Clone, Debug, PartialEq)]
pub struct PhasePosition {
    /// Prefill or decode.
    pub phase: Phase,
    /// The position's metrics.
    pub pos: LogitPosition,
}

/// Where a `blk.N.out` / `output_norm` cosine is lowest.
#[derive(Clone, Debug, PartialEq)]
pub struct OutCosine {
    /// Stage id.
    pub stage: String,
    /// Prefill or decode.
    pub phase: Phase,
    /// Sequence position (see [`Divergence::position`]).
    pub position: usize,
    /// The cosine there.
    pub cosine: f64,
    /// The NMSE there.
    pub nmse: f64,
}

/// The cell-level aggregates the gate checks (and the report's summary row shows).
#[derive(Clone, Debug, PartialEq)]
pub struct CellMetrics {
    /// Engine tokens == golden tokens.
    pub tokens_match: bool,
    /// Logits positions compared, prefill and decode.
    pub positions: usize,
    /// Positions whose top-1 tokens agree exactly.
    pub top1_agree: usize,
    /// Disagreements with margin below the tolerance.
    pub near_ties: Vec<PhasePosition>,
    /// Disagreements at or above the tolerance.
    pub mismatches: Vec<PhasePosition>,
    /// Mean KL (nats) over positions with full reference rows; `None` when there are none.
    pub mean_kl: Option<f64>,
    /// Positions with a KL value.
    pub kl_positions: usize,
    /// The largest KL and where.
    pub max_kl: Option<(f64, Phase, usize)>,
    /// Mean top-5 overlap over all positions; `None` without positions.
    pub top5_mean: Option<f64>,
    /// The lowest top-5 overlap and where.
    pub worst_top5: Option<(f64, Phase, usize)>,
    /// The lowest cosine of `blk.N.out` / `output_norm`.
    pub min_cosine_out: Option<OutCosine>,
}

impl CellMetrics {
    /// (top-1 agreements + near ties) / positions; NaN without positions.
    pub fn top1_agreement(&self) -> f64 {
        if self.positions == 0 {
            f64::NAN
        } else {
            (self.top1_agree + self.near_ties.len()) as f64 / self.positions as f64
        }
    }
}

/// Whether a stage id is a layer output (`blk.N.out`) or the final norm — the stages `min_cosine_out`
/// covers.
pub fn is_out_stage(stage: &str) -> bool {
    stage == "output_norm"
        || stage
            .strip_prefix("blk.")
            .and_then(|s| s.strip_suffix(".out"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Sequence position of row `row` of a stage in `phase` (decode rows start at the prompt length).
pub fn seq_position(cmp: &CellComparison, phase: Phase, row: usize) -> usize {
    match phase {
        Phase::Prefill => row,
        Phase::Decode => cmp.golden_tokens.len() + row,
    }
}

/// Aggregate a comparison into the numbers the gate checks; near ties are disagreements with margin
/// below `margin_tolerance` (logit units).
pub fn cell_metrics(cmp: &CellComparison, margin_tolerance: f64) -> CellMetrics {
    let mut m = CellMetrics {
        tokens_match: cmp.tokens_match(),
        positions: 0,
        top1_agree: 0,
        near_ties: Vec::new(),
        mismatches: Vec::new(),
        mean_kl: None,
        kl_positions: 0,
        max_kl: None,
        top5_mean: None,
        worst_top5: None,
        min_cosine_out: None,
    };
    let (mut kl_sum, mut top5_sum) = (0.0, 0.0);
    for lc in &cmp.logits {
        for p in &lc.positions {
            m.positions += 1;
            if p.ref_top == p.eng_top {
                m.top1_agree += 1;
            } else if p.margin < margin_tolerance {
                m.near_ties.push(PhasePosition {
                    phase: lc.phase,
                    pos: p.clone(),
                });
            } else {
                m.mismatches.push(PhasePosition {
                    phase: lc.phase,
                    pos: p.clone(),
                });
            }
            if let Some(kl) = p.kl {
                kl_sum += kl;
                m.kl_positions += 1;
                if m.max_kl.is_none_or(|(k, _, _)| kl > k) {
                    m.max_kl = Some((kl, lc.phase, p.position));
                }
            }
            top5_sum += p.top5;
            if m.worst_top5.is_none_or(|(t, _, _)| p.top5 < t) {
                m.worst_top5 = Some((p.top5, lc.phase, p.position));
            }
        }
    }
    if m.kl_positions > 0 {
        m.mean_kl = Some(kl_sum / m.kl_positions as f64);
    }
    if m.positions > 0 {
        m.top5_mean = Some(top5_sum / m.positions as f64);
    }
    for s in cmp.stages.iter().filter(|s| is_out_stage(&s.stage)) {
        let (row, cosine) =
            lowest(&s.cosine_by_position).unwrap_or((s.worst_position, s.cosine.min));
        if m.min_cosine_out.as_ref().is_none_or(|o| cosine < o.cosine) {
            m.min_cosine_out = Some(OutCosine {
                stage: s.stage.clone(),
                phase: s.phase,
                position: seq_position(cmp, s.phase, row),
                cosine,
                nmse: s.nmse_by_position.get(row).copied().unwrap_or(s.nmse.max),
            });
        }
    }
    m
}

/// Index of the first smallest value (NaN never wins); `None` for an empty slice.
pub fn lowest_index(v: &[f64]) -> Option<usize> {
    lowest(v).map(|(i, _)| i)
}

/// (index, value) of the first smallest value.
fn lowest(v: &[f64]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, &x) in v.iter().enumerate() {
        if best.is_none_or(|(_, b)| x < b) {
            best = Some((i, x));
        }
    }
    best
}

fn describe_disagreement(p: &PhasePosition) -> String {
    format!(
        "{} position {}, ref top {} vs engine {} (margin {})",
        p.phase,
        p.pos.position,
        p.pos.ref_top,
        p.pos.eng_top,
        fmt_fixed(p.pos.margin, 4)
    )
}

/// The verdict on a cell whose engine could not run the model (`error`, e.g. a weight type without
/// kernels): a failure with the metric `engine_error` (value NaN: nothing was measured) and the error as
/// its detail. Whatever the thresholds, such a cell never passes.
pub fn engine_error_verdict(error: &str, th: &CellThresholds) -> Verdict {
    Verdict {
        pass: false,
        failures: vec![Failure {
            metric: "engine_error".into(),
            value: f64::NAN,
            threshold: f64::NAN,
            detail: format!("the engine cannot run this model: {error}"),
        }],
        first_divergent: None,
        margin_tolerance: th.margin_tolerance,
    }
}

/// Hold one cell's comparison to its thresholds.
///
/// `_cell` names the cell; its thresholds were already chosen by [`Thresholds::for_cell`]. Every metric
/// that cannot be measured at all (no logits positions, no full reference row for KL, no `blk.N.out`)
/// is a failure with value NaN, never a silent pass.
pub fn evaluate(_cell: &Cell, cmp: &CellComparison, th: &CellThresholds) -> Verdict {
    let m = cell_metrics(cmp, th.margin_tolerance);
    let mut failures = Vec::new();
    let mut fail = |metric: &str, value: f64, threshold: f64, detail: String| {
        failures.push(Failure {
            metric: metric.to_string(),
            value,
            threshold,
            detail,
        });
    };

    if th.tokens_must_match && !m.tokens_match {
        let (g, e) = (&cmp.golden_tokens, &cmp.engine_tokens);
        let at = g
            .iter()
            .zip(e)
            .position(|(a, b)| a != b)
            .unwrap_or(g.len().min(e.len()));
        let show = |v: &[u32]| v.get(at).map_or("(end)".to_string(), |t| t.to_string());
        fail(
            "tokens_match",
            0.0,
            1.0,
            format!(
                "golden has {} tokens, engine {}; first difference at index {at}: golden {} vs engine {}",
                g.len(),
                e.len(),
                show(g),
                show(e)
            ),
        );
    }

    let agreement = m.top1_agreement();
    if m.positions == 0 {
        fail(
            "top1_agreement",
            f64::NAN,
            th.min_top1_agreement,
            "no logits positions were compared".into(),
        );
    } else if agreement < th.min_top1_agreement {
        let mut detail: Vec<String> = m
            .mismatches
            .iter()
            .take(3)
            .map(describe_disagreement)
            .collect();
        if m.mismatches.len() > 3 {
            detail.push(format!("and {} more", m.mismatches.len() - 3));
        }
        let ties = match m.near_ties.len() {
            0 => String::new(),
            n => format!("; {n} near tie(s) counted as agreeing"),
        };
        fail(
            "top1_agreement",
            agreement,
            th.min_top1_agreement,
            format!(
                "{}/{} positions agree{ties}; mismatches: {}",
                m.top1_agree + m.near_ties.len(),
                m.positions,
                detail.join("; ")
            ),
        );
    }

    match m.mean_kl {
        None => fail(
            "mean_kl",
            f64::NAN,
            th.max_mean_kl,
            "no position has a full reference logits row to compute KL".into(),
        ),
        Some(kl) if kl > th.max_mean_kl || kl.is_nan() => {
            let (mx, ph, pos) = m.max_kl.unwrap_or((kl, Phase::Prefill, 0));
            fail(
                "mean_kl",
                kl,
                th.max_mean_kl,
                format!(
                    "over {} positions; largest {} at {ph} position {pos}",
                    m.kl_positions,
                    fmt_sci(mx, 3)
                ),
            );
        }
        Some(_) => {}
    }
    if let (Some(limit), Some((mx, ph, pos))) = (th.max_kl, m.max_kl) {
        if mx > limit {
            fail("max_kl", mx, limit, format!("{ph} position {pos}"));
        }
    }

    match (m.top5_mean, m.worst_top5) {
        (Some(t5), Some((w, ph, pos))) if t5 < th.min_top5_mean => fail(
            "top5_mean",
            t5,
            th.min_top5_mean,
            format!("lowest {} at {ph} position {pos}", fmt_fixed(w, 4)),
        ),
        (None, _) => fail(
            "top5_mean",
            f64::NAN,
            th.min_top5_mean,
            "no logits positions were compared".into(),
        ),
        _ => {}
    }

    match &m.min_cosine_out {
        None => fail(
            "min_cosine_out",
            f64::NAN,
            th.min_cosine_out,
            "no blk.N.out or output_norm stage was compared".into(),
        ),
        Some(o) if o.cosine < th.min_cosine_out => fail(
            "min_cosine_out",
            o.cosine,
            th.min_cosine_out,
            format!(
                "{} {} position {} (NMSE {})",
                o.stage,
                o.phase,
                o.position,
                fmt_sci(o.nmse, 3)
            ),
        ),
        Some(_) => {}
    }

    let first = if th.stage_exact {
        let inexact = first_inexact(cmp);
        let unmeasured = cmp
            .stages
            .iter()
            .find(|s| s.exact_at_storage_by_position.len() != s.cosine_by_position.len());
        let omitted = cmp.not_compared.iter().find(|n| {
            n.reason == crate::compare::ENGINE_DID_NOT_EMIT
                || n.reason == crate::compare::ENGINE_HAS_NO_SUCH_STAGE
        });
        if cmp.stages.is_empty() {
            fail("stage_exact", f64::NAN, 1.0, "no stage was compared".into());
        } else if let Some(n) = omitted {
            fail(
                "stage_exact",
                f64::NAN,
                1.0,
                format!(
                    "the golden holds {} ({}) but the engine did not emit it",
                    n.stage, n.phase
                ),
            );
        } else if let Some(s) = unmeasured {
            fail(
                "stage_exact",
                f64::NAN,
                1.0,
                format!(
                    "{} {}: the comparison holds no storage-precision equality to check",
                    s.stage, s.phase
                ),
            );
        } else if let Some(d) = &inexact {
            let n = cmp
                .stages
                .iter()
                .filter(|s| s.exact_at_storage_by_position.iter().any(|e| !e))
                .count();
            fail(
                "stage_exact",
                0.0,
                1.0,
                format!(
                    "{n} stage(s) differ from the golden at its storage precision; first {} {} position {} \
                     (cosine {}, NMSE {})",
                    d.stage,
                    d.phase,
                    d.position,
                    fmt_fixed(d.cosine, 8),
                    fmt_sci(d.nmse, 3)
                ),
            );
        }
        inexact
    } else {
        first_divergent(cmp, th.stage_min_cosine, th.stage_max_nmse)
    };
    Verdict {
        pass: failures.is_empty(),
        failures,
        first_divergent: first,
        margin_tolerance: th.margin_tolerance,
    }
}

/// The first stage in forward order (prefill stages in the order of `cmp.stages`, which is forward order;
/// then decode) that diverges at some position — cosine below `min_cosine`, or NMSE above `max_nmse`
/// when given — with the first such position.
pub fn first_divergent(
    cmp: &CellComparison,
    min_cosine: f64,
    max_nmse: Option<f64>,
) -> Option<Divergence> {
    let bad = |c: f64, n: f64| c < min_cosine || max_nmse.is_some_and(|m| n > m);
    for phase in [Phase::Prefill, Phase::Decode] {
        for s in cmp.stages.iter().filter(|s| s.phase == phase) {
            let row = s
                .cosine_by_position
                .iter()
                .zip(s.nmse_by_position.iter().chain(std::iter::repeat(&0.0)))
                .position(|(&c, &n)| bad(c, n));
            let Some(row) = row else { continue };
            return Some(Divergence {
                stage: s.stage.clone(),
                phase,
                position: seq_position(cmp, phase, row),
                cosine: s.cosine_by_position[row],
                nmse: s.nmse_by_position.get(row).copied().unwrap_or(s.nmse.max),
            });
        }
    }
    None
}

/// The first stage in forward order (prefill, then decode) with a position where the engine's row,
/// rounded to the golden's storage type, differs from the golden: the divergence marker of a mode whose
/// floor is bit equality ([`CellThresholds::stage_exact`]).
pub fn first_inexact(cmp: &CellComparison) -> Option<Divergence> {
    for phase in [Phase::Prefill, Phase::Decode] {
        for s in cmp.stages.iter().filter(|s| s.phase == phase) {
            let Some(row) = s.exact_at_storage_by_position.iter().position(|e| !e) else {
                continue;
            };
            return Some(Divergence {
                stage: s.stage.clone(),
                phase,
                position: seq_position(cmp, phase, row),
                cosine: s.cosine_by_position.get(row).copied().unwrap_or(f64::NAN),
                nmse: s.nmse_by_position.get(row).copied().unwrap_or(f64::NAN),
            });
        }
    }
    None
}

/// Format a metric's value (or threshold) the way failure lines and reports show it: KL in scientific
/// notation, everything else fixed with trailing zeros trimmed.
pub fn fmt_metric(metric: &str, v: f64) -> String {
    match metric {
        "mean_kl" | "max_kl" => fmt_sci(v, 3),
        "tokens_match" | "stage_exact" => fmt_fixed(v, 0),
        _ => fmt_fixed(v, 8),
    }
}

/// The one-line reason of a failing cell, `None` when it passed:
/// `FAIL <cell id>: <metric> = <value> (threshold <threshold>) — <detail>[; <next failure>...];
/// first divergent stage: <stage> (<phase> position p, cosine c)`.
pub fn failure_line(cell: &Cell, verdict: &Verdict) -> Option<String> {
    if verdict.pass {
        return None;
    }
    let failures: Vec<String> = verdict
        .failures
        .iter()
        .map(|f| {
            format!(
                "{} = {} (threshold {}) — {}",
                f.metric,
                fmt_metric(&f.metric, f.value),
                fmt_metric(&f.metric, f.threshold),
                f.detail
            )
        })
        .collect();
    let failures = if failures.is_empty() {
        "failed".to_string()
    } else {
        failures.join("; ")
    };
    let divergent = match &verdict.first_divergent {
        Some(d) => format!(
            "first divergent stage: {} ({} position {}, cosine {})",
            d.stage,
            d.phase,
            d.position,
            fmt_fixed(d.cosine, 8)
        ),
        None => "first divergent stage: none".to_string(),
    };
    Some(format!("FAIL {}: {failures}; {divergent}", cell.id()))
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
