//! The verdict of one cell: its comparison with the golden held to its thresholds ([`evaluate`]), the
//! first divergent stage, the metrics behind them, and the one-line reasons `lockstep gate` prints.

use lockstep_engine::{Stage, StageKind};
use serde::{Deserialize, Serialize};

use crate::compare::{CellComparison, Phase, StageComparison};
use crate::format::{fmt_fixed, fmt_sci};
use crate::matrix::Cell;
use crate::metrics::LogitPosition;

use super::thresholds::CellThresholds;

/// The verdict on one cell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// True when no threshold failed.
    pub pass: bool,
    /// Every threshold that failed.
    pub failures: Vec<Failure>,
    /// The first stage in forward order whose cosine falls below `stage_min_cosine` (informative; not a
    /// failure by itself); [`TOKENS_MARKER`] at the first differing token when the engine tokenized the
    /// prompt otherwise.
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

/// Whether a stage id is a layer output (`blk.N.out`), the final norm or an encoder's pooled embedding —
/// the stages `min_cosine_out` covers.
pub fn is_out_stage(stage: &str) -> bool {
    Stage::parse(stage).is_some_and(|s| {
        s.is_layer_output() || matches!(s.kind, StageKind::OutputNorm | StageKind::Pooled)
    })
}

/// Sequence position of row `row` of the stage comparison `s` (decode rows start at the prompt length; a
/// compact golden's prefill rows are at its `stage_positions`, [`StageComparison::row_position`]).
pub fn seq_position(cmp: &CellComparison, s: &StageComparison, row: usize) -> usize {
    match s.phase {
        Phase::Prefill => s.row_position(row),
        Phase::Decode => cmp.golden_tokens.len() + s.row_position(row),
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
                position: seq_position(cmp, s, row),
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

/// Name the token ids in a failing cell's `top1_agreement` mismatches (`ref top 42 "Paris" vs engine 17
/// " the"`) and its `tokens_match` difference with their vocabulary text, from `piece` (the engine's
/// [`crate::engine::Engine::token_piece`]; `lockstep run` calls this with the engine that ran the cell, since
/// the gate alone has no vocabulary). An id the vocabulary cannot name is left bare; a piece is shown
/// Rust-escaped (`"\n"`), cut to 24 characters.
pub fn name_token_pieces(verdict: &mut Verdict, piece: &dyn Fn(u32) -> Option<String>) {
    for f in &mut verdict.failures {
        let from = match f.metric.as_str() {
            "top1_agreement" => Some(0),
            // the counts before it are not token ids
            "tokens_match" => f.detail.find("first difference at"),
            _ => None,
        };
        if let Some(from) = from {
            f.detail = annotate_ids(&f.detail, from, piece);
        }
    }
}

/// `detail` with each id after a `top`, `engine` or `golden` word (from byte `from` on) followed by its piece.
fn annotate_ids(detail: &str, from: usize, piece: &dyn Fn(u32) -> Option<String>) -> String {
    let (head, tail) = detail.split_at(from);
    let mut out = head.to_string();
    let mut prev = "";
    for (i, word) in tail.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(word);
        let digits: &str = &word[..word
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(word.len())];
        let rest = &word[digits.len()..];
        if matches!(prev, "top" | "engine" | "golden")
            && !digits.is_empty()
            && matches!(rest, "" | ";" | "," | ")")
        {
            if let Some(p) = digits.parse::<u32>().ok().and_then(piece) {
                let p: String = p.chars().take(24).collect();
                out.truncate(out.len() - rest.len());
                out.push_str(&format!(" {p:?}{rest}"));
            }
        }
        prev = word;
    }
    out
}

/// How a session engine's own failure begins ([`crate::protocol::client::StepFailed`], a `load` that
/// failed without `unsupported`): a cell with such an error failed in the engine, not for want of kernels.
pub const ENGINE_FAILED_MARK: &str = "the session engine failed `";

/// The verdict on a cell whose engine could not run the model (`error`, e.g. a weight type without
/// kernels) or failed while running it (an error containing [`ENGINE_FAILED_MARK`]): a failure with the
/// metric `engine_error` (value NaN: nothing was measured) and the error as its detail. Whatever the
/// thresholds, such a cell never passes.
pub fn engine_error_verdict(error: &str, th: &CellThresholds) -> Verdict {
    Verdict {
        pass: false,
        failures: vec![Failure {
            metric: "engine_error".into(),
            value: f64::NAN,
            threshold: f64::NAN,
            detail: if error.contains(ENGINE_FAILED_MARK) {
                format!("the engine failed during this cell: {error}")
            } else {
                format!("the engine cannot run this model: {error}")
            },
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

    // the first differing token, if the engine tokenized otherwise: then it is the marker (below)
    let token_at = (!m.tokens_match).then(|| {
        let (g, e) = (&cmp.golden_tokens, &cmp.engine_tokens);
        g.iter()
            .zip(e)
            .position(|(a, b)| a != b)
            .unwrap_or(g.len().min(e.len()))
    });
    if let (true, Some(at)) = (th.tokens_must_match, token_at) {
        let (g, e) = (&cmp.golden_tokens, &cmp.engine_tokens);
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

    // An encoder has no logits: top-1, KL and top-5 do not exist for it. Its output, the pooled embedding,
    // must have been compared; it is held to min_cosine_out (below, with the layer outputs), to
    // stage_max_nmse when the cell has one, and to stage_exact like every stage.
    let encoder = cmp.is_encoder();
    if encoder {
        match cmp.pooled() {
            None => fail(
                "pooled",
                f64::NAN,
                th.min_cosine_out,
                "an encoder's pooled embedding (`pooled`) was not compared".into(),
            ),
            Some(p) => {
                if let Some(limit) = th.stage_max_nmse {
                    let nmse = p.max_nmse();
                    if nmse > limit || nmse.is_nan() {
                        fail(
                            "pooled_nmse",
                            nmse,
                            limit,
                            format!("pooled embedding, cosine {}", fmt_fixed(p.cosine.min, 8)),
                        );
                    }
                }
            }
        }
    }
    let agreement = m.top1_agreement();
    if encoder {
        // no logits positions: nothing to agree on (the pooled embedding is held above)
    } else if m.positions == 0 {
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
        // the counts of the report's top-1 column: exact agreements, then the near ties beside them
        let ties = match m.near_ties.len() {
            0 => String::new(),
            n => format!(
                " (+{n} near tie{} counted as agreeing: {}/{})",
                if n == 1 { "" } else { "s" },
                m.top1_agree + n,
                m.positions
            ),
        };
        fail(
            "top1_agreement",
            agreement,
            th.min_top1_agreement,
            format!(
                "{}/{} positions agree{ties}; mismatches: {}",
                m.top1_agree,
                m.positions,
                detail.join("; ")
            ),
        );
    }

    match m.mean_kl {
        _ if encoder => {}
        None => fail(
            "mean_kl",
            f64::NAN,
            th.max_mean_kl,
            "no position has a full reference logits row to compute KL".into(),
        ),
        Some(kl) if kl > th.max_mean_kl || kl.is_nan() => {
            let (mx, ph, pos) = m.max_kl.unwrap_or((kl, Phase::Prefill, 0));
            // KL needs the reference's full logits row; a golden that keeps top-k elsewhere says so
            let over = if m.kl_positions < m.positions {
                format!(
                    "over {} of {} positions (the golden keeps the full logits row at {} position{} only, \
                     top-k elsewhere)",
                    m.kl_positions,
                    m.positions,
                    m.kl_positions,
                    if m.kl_positions == 1 { "" } else { "s" }
                )
            } else {
                format!("over {} positions", m.kl_positions)
            };
            fail(
                "mean_kl",
                kl,
                th.max_mean_kl,
                format!("{over}; largest {} at {ph} position {pos}", fmt_sci(mx, 3)),
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
        _ if encoder => {}
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
            format!(
                "no blk.N.out or output_norm stage was compared{}",
                unmapped_hint(cmp)
            ),
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
            fail(
                "stage_exact",
                f64::NAN,
                1.0,
                format!("no stage was compared{}", unmapped_hint(cmp)),
            );
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
    // other tokens make every stage comparison read other inputs: the first differing token is the marker,
    // whatever a stage shows (issue 42: a dropped BOS was marked at a later layer's ordinary drift)
    let first = match token_at {
        Some(at) => Some(Divergence {
            stage: TOKENS_MARKER.to_string(),
            phase: Phase::Prefill,
            position: at,
            cosine: f64::NAN,
            nmse: f64::NAN,
        }),
        None => first,
    };
    Verdict {
        pass: failures.is_empty(),
        failures,
        first_divergent: first,
        margin_tolerance: th.margin_tolerance,
    }
}

/// The first-divergent marker of a cell whose engine tokenized the prompt otherwise than the oracle
/// ([`Verdict::first_divergent`]'s `stage`; its `position` is the first differing token, cosine and NMSE NaN).
pub const TOKENS_MARKER: &str = "tokens";

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
                position: seq_position(cmp, s, row),
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
                position: seq_position(cmp, s, row),
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

/// Why stages may be missing from a comparison: the names the engine dumped that map to no canonical
/// stage id ([`crate::compare::NOT_IN_STAGE_MAP`]) — ` (the engine dumped N stages under names lockstep
/// does not know, e.g. attn_norm-0: give --stage-map FILE, or add them to the one given)` — or "" when
/// there are none.
fn unmapped_hint(cmp: &CellComparison) -> String {
    let unmapped: Vec<&str> = cmp
        .not_compared
        .iter()
        .filter(|n| n.reason == crate::compare::NOT_IN_STAGE_MAP)
        .map(|n| n.stage.as_str())
        .collect();
    match unmapped.first() {
        None => String::new(),
        Some(first) => format!(
            " (the engine dumped {} stage(s) under names lockstep does not know, e.g. {first}: give \
             --stage-map FILE, or add them to the one given)",
            unmapped.len()
        ),
    }
}

/// One failed threshold in words: `<metric> = <value> (threshold <threshold>)`. A value that could not be
/// measured reads `<metric> not measured`, a threshold that does not apply (NaN: an engine error, a finding
/// at bit equality) is left out, and where neither exists the metric's name alone stands — a value or a
/// threshold never prints as `nan`.
pub fn failure_value(f: &Failure) -> String {
    let value = if f.value.is_nan() && f.threshold.is_nan() {
        // nothing to measure against (an engine error, a finding at bit equality): the name says it
        f.metric.clone()
    } else if f.value.is_nan() {
        format!("{} not measured", f.metric)
    } else {
        format!("{} = {}", f.metric, fmt_metric(&f.metric, f.value))
    };
    if f.threshold.is_nan() {
        value
    } else {
        format!("{value} (threshold {})", fmt_metric(&f.metric, f.threshold))
    }
}

/// The failed thresholds of a failing verdict, joined: `<failure_value> — <detail>; ...`.
pub fn failure_reasons(verdict: &Verdict) -> String {
    let failures: Vec<String> = verdict
        .failures
        .iter()
        .map(|f| format!("{} — {}", failure_value(f), f.detail))
        .collect();
    if failures.is_empty() {
        "failed".to_string()
    } else {
        failures.join("; ")
    }
}

/// The one-line reason of a failing cell, `None` when it passed:
/// `FAIL <cell id>: <metric> = <value> (threshold <threshold>) — <detail>[; <next failure>...];
/// first divergent stage: <localization>`, where `localization` is the cell's verdict in words (a bisect
/// finding's [`crate::judge::Finding::headline`], which `crate::report::cell_failure_line` passes) or,
/// without one, the verdict's marker: `<stage> (<phase> position p, cosine c)`.
pub fn failure_line_with(
    cell: &Cell,
    verdict: &Verdict,
    localization: Option<String>,
) -> Option<String> {
    if verdict.pass {
        return None;
    }
    let divergent = match (localization, &verdict.first_divergent) {
        (Some(l), _) => format!("first divergent stage: {l}"),
        (None, Some(d)) if d.stage == TOKENS_MARKER => format!(
            "first divergent stage: {TOKENS_MARKER} (the prompt's token {} differs)",
            d.position
        ),
        (None, Some(d)) => format!(
            "first divergent stage: {} ({} position {}, cosine {})",
            d.stage,
            d.phase,
            d.position,
            fmt_fixed(d.cosine, 8)
        ),
        (None, None) => "first divergent stage: none".to_string(),
    };
    Some(format!(
        "FAIL {}: {}; {divergent}",
        cell.id(),
        failure_reasons(verdict)
    ))
}

/// [`failure_line_with`] from the verdict alone (its marker as the localization).
pub fn failure_line(cell: &Cell, verdict: &Verdict) -> Option<String> {
    failure_line_with(cell, verdict, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_in_mismatches_are_named_with_their_pieces() {
        let piece = |id: u32| match id {
            42 => Some("Paris".to_string()),
            17 => Some(" the\n".to_string()),
            _ => None,
        };
        let mut v = Verdict {
            pass: false,
            failures: vec![
                Failure {
                    metric: "top1_agreement".into(),
                    value: 0.5,
                    threshold: 1.0,
                    detail: "1/2 positions agree; mismatches: prefill position 3, ref top 42 vs engine 17 \
                             (margin 0.5000); decode position 5, ref top 9 vs engine 42 (margin 1.0000)"
                        .into(),
                },
                Failure {
                    metric: "tokens_match".into(),
                    value: 0.0,
                    threshold: 1.0,
                    detail: "golden has 17 tokens, engine 42; first difference at index 3: golden 42 vs \
                             engine 17"
                        .into(),
                },
            ],
            first_divergent: None,
            margin_tolerance: 0.4,
        };
        name_token_pieces(&mut v, &piece);
        assert_eq!(
            v.failures[0].detail,
            "1/2 positions agree; mismatches: prefill position 3, ref top 42 \"Paris\" vs engine 17 \" the\\n\" \
             (margin 0.5000); decode position 5, ref top 9 vs engine 42 \"Paris\" (margin 1.0000)"
        );
        // the counts are not ids
        assert_eq!(
            v.failures[1].detail,
            "golden has 17 tokens, engine 42; first difference at index 3: golden 42 \"Paris\" vs engine \
             17 \" the\\n\""
        );
    }
    use crate::compare::{compare_stage, NotCompared, ENCODER_NO_LOGITS};
    use ndarray::array;

    fn thresholds() -> CellThresholds {
        CellThresholds {
            tokens_must_match: true,
            min_top1_agreement: 1.0,
            max_mean_kl: 1e-3,
            max_kl: None,
            min_top5_mean: 0.9,
            min_cosine_out: 0.9999,
            stage_min_cosine: 0.999,
            stage_max_nmse: Some(1e-4),
            margin_tolerance: 0.01,
            stage_exact: false,
            stage_floor_headroom: None,
            yardstick: String::new(),
        }
    }

    fn encoder_cmp(pooled_engine: Option<ndarray::Array2<f32>>) -> CellComparison {
        let golden = array![[1.0f32, 2.0, 3.0]];
        CellComparison {
            golden_tokens: vec![2, 5, 3],
            engine_tokens: vec![2, 5, 3],
            stages: pooled_engine
                .map(|e| compare_stage("pooled", Phase::Prefill, &e, &golden, "g.npz").unwrap())
                .into_iter()
                .collect(),
            not_compared: vec![NotCompared {
                stage: "logits".into(),
                phase: Phase::Prefill,
                reason: ENCODER_NO_LOGITS.into(),
            }],
            logits: Vec::new(),
        }
    }

    #[test]
    fn an_encoder_cell_is_held_to_its_pooled_embedding_not_to_logits() {
        let cell = Cell {
            model: "synth-bert".into(),
            prompt: "synth".into(),
            quant: "F32".into(),
            mode: lockstep_engine::NumericsMode::Ggml,
            simd: "off".into(),
            oracle: "llama.cpp-f32kv".into(),
            engine: "lockstep".into(),
        };
        let th = thresholds();
        // equal pooled embedding: no logits metric is asked for
        let v = evaluate(&cell, &encoder_cmp(Some(array![[1.0f32, 2.0, 3.0]])), &th);
        assert!(v.pass, "{:?}", v.failures);
        // a wrong pooled embedding fails min_cosine_out and its NMSE
        let v = evaluate(&cell, &encoder_cmp(Some(array![[3.0f32, 2.0, 1.0]])), &th);
        let metrics: Vec<&str> = v.failures.iter().map(|f| f.metric.as_str()).collect();
        assert!(
            metrics.contains(&"pooled_nmse") && metrics.contains(&"min_cosine_out"),
            "{metrics:?}"
        );
        // no pooled embedding compared: a failure, never a silent pass
        let v = evaluate(&cell, &encoder_cmp(None), &th);
        assert!(
            v.failures.iter().any(|f| f.metric == "pooled"),
            "{:?}",
            v.failures
        );
    }

    /// Issue 42: a tokenization failure is the marker, even where a stage also diverges (other tokens make
    /// every stage read another input), and the FAIL line says so.
    #[test]
    fn a_tokenization_failure_is_the_first_divergent_marker() {
        let cell = Cell {
            model: "synth-bert".into(),
            prompt: "synth".into(),
            quant: "F32".into(),
            mode: lockstep_engine::NumericsMode::Reference,
            simd: "off".into(),
            oracle: "llama.cpp-f32kv".into(),
            engine: "lockstep".into(),
        };
        let th = thresholds();
        let mut cmp = encoder_cmp(Some(array![[3.0f32, 2.0, 1.0]]));
        // the same tokens: the divergent stage is the marker
        let v = evaluate(&cell, &cmp, &th);
        assert_eq!(v.first_divergent.as_ref().unwrap().stage, "pooled");
        // a dropped BOS: the tokens are
        cmp.engine_tokens = vec![5, 3];
        let v = evaluate(&cell, &cmp, &th);
        let d = v.first_divergent.as_ref().unwrap();
        assert_eq!((d.stage.as_str(), d.position), (TOKENS_MARKER, 0));
        assert!(v.failures.iter().any(|f| f.metric == "tokens_match"));
        let line = failure_line(&cell, &v).unwrap();
        assert!(
            line.ends_with("first divergent stage: tokens (the prompt's token 0 differs)"),
            "{line}"
        );
        // also where the thresholds do not gate the tokens: the marker still says where they differ
        let th = CellThresholds {
            tokens_must_match: false,
            ..thresholds()
        };
        cmp.engine_tokens = vec![2, 5, 4];
        let v = evaluate(&cell, &cmp, &th);
        assert_eq!(v.first_divergent.as_ref().unwrap().position, 2);
    }

    /// A user who runs a session engine that dumps under its own names without `--stage-map` learns why
    /// nothing was compared, from the failure itself.
    #[test]
    fn no_stage_compared_names_the_unmapped_names_and_the_flag() {
        let cell = Cell {
            model: "synth-bert".into(),
            prompt: "synth".into(),
            quant: "F32".into(),
            mode: lockstep_engine::NumericsMode::Ggml,
            simd: "off".into(),
            oracle: "llama.cpp-f32kv".into(),
            engine: "numpy@1".into(),
        };
        let th = CellThresholds {
            stage_exact: true,
            ..thresholds()
        };
        let mut cmp = encoder_cmp(None);
        let v = evaluate(&cell, &cmp, &th);
        let exact = v
            .failures
            .iter()
            .find(|f| f.metric == "stage_exact")
            .unwrap();
        assert_eq!(exact.detail, "no stage was compared");
        for name in ["attn_norm-0", "l_out-0"] {
            cmp.not_compared.push(NotCompared {
                stage: name.into(),
                phase: Phase::Prefill,
                reason: crate::compare::NOT_IN_STAGE_MAP.into(),
            });
        }
        let v = evaluate(&cell, &cmp, &th);
        let exact = v
            .failures
            .iter()
            .find(|f| f.metric == "stage_exact")
            .unwrap();
        assert!(
            exact
                .detail
                .contains("dumped 2 stage(s) under names lockstep does not know, e.g. attn_norm-0")
                && exact.detail.contains("--stage-map"),
            "{}",
            exact.detail
        );
    }
}
