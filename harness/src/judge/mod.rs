//! The judging core shared by `lockstep run`, `lockstep bisect`, the rounding probe and `lockstep floors`:
//! the case and its passes ([`case`]), the verdict ([`Finding`], [`judge`]), how a verdict holds a gate
//! ([`gate_finding`]) and the measured floors a cell is judged against ([`floor_set`]).
//!
//! The verdict, read in forward order (prefill, then decode):
//!
//! - **structural** at stage X of layer L: the first stage whose *local* error is above the cell's floor.
//!   Where the floor is bit equality (`stage_exact`, ggml mode) and the layer's injected input is stored
//!   exactly (f32), any difference at the golden's storage precision is above it; otherwise the floor is
//!   the cell's stage cutoffs (`stage_min_cosine`, `stage_max_nmse`) — the numbers the gate's marker uses.
//! - **oracle-side rounding**: in reference mode, rows above the measured floor only where ggml mode
//!   equals the golden bit for bit ([`rounding`]).
//! - **accumulated drift**: no stage's local error is above the floor, yet the accumulated pass diverges
//!   (its first divergent stage is reported; for a failing cell, where it first leaves the gate).
//! - **cannot localize**: no local pass could run (the engine takes no injected stages, or the golden stores
//!   no layer output): where the accumulated pass is first seen to differ, and why that is all there is.
//! - **tokens**: the engine tokenized the prompt otherwise.
//! - **none**: neither pass diverges.

use std::path::Path;

use anyhow::Result;
use lockstep_engine::NumericsMode;

use crate::capture::{input_known, Known};
use crate::compare::{CellComparison, Phase, StageComparison};
use crate::engine::Engine;
use crate::floors::{kind_of, FloorSet, FloorStatistic, Floors};
use crate::format::fmt_e3;
use crate::gate::{
    first_divergent, first_inexact, seq_position, CellThresholds, Divergence, Failure, Verdict,
};
use crate::golden::{GoldenEntry, GoldenFile};
use crate::matrix::Cell;

pub mod case;
pub mod finding;
pub mod rounding;

pub use case::{capture, non_finite_verdict, Case, Pass};
pub use finding::{
    render_rounding, tokens_finding, Finding, NoLocalPass, RoundingEvidence, TokenAt,
};
pub use rounding::q8_rounding;

use case::NonFinite;
use rounding::{confirm_rounding, cross_check, CrossCheck};

/// The floors a cell's thresholds ask for (`stage_floor_headroom`), read from `path` for this golden.
///
/// Errors: the file is missing or stale, or lacks the cell (see [`Floors::for_golden`]).
pub fn floor_set(
    path: &Path,
    th: &CellThresholds,
    cell: &Cell,
    entry: &GoldenEntry,
) -> Result<Option<FloorSet>> {
    if th.stage_exact || th.stage_floor_headroom.is_none() {
        return Ok(None);
    }
    let floors = Floors::load(path)?;
    Ok(Some(
        floors
            .for_golden(
                path,
                // the Hugging Face copy of a registered model: its source's floors (the same stages, bit
                // for bit on F32 weights: engine/src/hf tests)
                &crate::registry::Registry::golden_model_of(&cell.model),
                &cell.oracle,
                cell.mode.name(),
                &entry.path,
                &entry.sha256,
            )?
            .clone(),
    ))
}

/// Hold a cell's gate verdict to a bisect finding: a structural finding fails the cell (`structural`) and
/// is its first divergent stage; oracle-side rounding and drift leave the verdict as it is.
pub fn gate_finding(verdict: &mut Verdict, finding: &Finding) {
    if let Finding::Structural { at, floor, ratio } = finding {
        verdict.pass = false;
        verdict.failures.push(Failure {
            metric: "structural".into(),
            // the ratio to the measured floor; at bit equality (no ratio) neither applies
            value: ratio.unwrap_or(f64::NAN),
            threshold: if ratio.is_some() { 1.0 } else { f64::NAN },
            detail: format!(
                "{} ({}, position {}) with the golden's own input injected: NMSE {}, above the floor: {floor}",
                at.stage,
                at.phase,
                at.position,
                fmt_e3(at.nmse)
            ),
        });
        verdict.first_divergent = Some(at.clone());
    }
}

/// A verdict and the local pass it was read from.
pub struct Judged {
    /// The verdict.
    pub finding: Finding,
    /// The local pass's comparison (`None` when it was not needed: an exact accumulated pass).
    pub local: Option<CellComparison>,
}

impl Judged {
    /// Per layer, the largest local NMSE of any of its stages over the prefill positions (0 where every
    /// stage of the layer is exact at storage precision); empty without a local pass.
    pub fn local_nmse_by_layer(&self) -> Vec<f64> {
        let mut out: Vec<f64> = Vec::new();
        for s in self.local.iter().flat_map(|c| c.stages.iter()) {
            let (Some(l), Phase::Prefill) = (s.layer, s.phase) else {
                continue;
            };
            if out.len() <= l {
                out.resize(l + 1, 0.0);
            }
            if !s.exact_at_storage() {
                out[l] = out[l].max(s.max_nmse());
            }
        }
        out
    }

    /// The verdict of an engine that cannot be bisected (its stages are observed, not replaced): the
    /// first differing token if it tokenized otherwise, else [`Finding::NotLocalized`] (no inject) at the
    /// accumulated pass's first divergent stage — never drift, which needs a local pass. [`settle`] turns
    /// it into none where the cell passes and nothing differs.
    pub fn accumulated_only(
        case: &Case,
        engine: &dyn Engine,
        th: &CellThresholds,
        accumulated: Option<&CellComparison>,
    ) -> Judged {
        Judged {
            finding: case
                .tokens_finding(engine)
                .unwrap_or_else(|| not_localized(NoLocalPass::NoInject, th, accumulated)),
            local: None,
        }
    }
}

/// [`Finding::NotLocalized`] at the accumulated pass's first divergent stage, if any.
fn not_localized(
    why: NoLocalPass,
    th: &CellThresholds,
    accumulated: Option<&CellComparison>,
) -> Finding {
    let at = match drift(th, accumulated) {
        Finding::AccumulatedDrift { at } => Some(at),
        _ => None,
    };
    Finding::NotLocalized { why, at }
}

/// Make a cell's gate verdict and its finding one answer, the one every view prints (report.md's failure
/// line and first-divergent table, the HTML run page, `lockstep bisect`):
///
/// - a structural finding fails the cell ([`gate_finding`]);
/// - a failing cell whose finding places nothing gets the place where the accumulated pass first leaves
///   the gate ([`gate_site`]): drift there after a clean local pass — or, where the floor is bit equality
///   and the logits alone differ (every stage equal to the golden), a structural finding at `logits`;
///   without a local pass, [`Finding::NotLocalized`] there;
/// - a passing cell without a local pass where nothing differs is `none`;
/// - the verdict's first divergent stage is the finding's (the tokens marker stays the tokens').
pub fn settle(
    verdict: &mut Verdict,
    finding: &mut Finding,
    accumulated: Option<&CellComparison>,
    th: &CellThresholds,
) {
    gate_finding(verdict, finding);
    if verdict.pass {
        if matches!(finding, Finding::NotLocalized { at: None, .. }) {
            *finding = Finding::None;
        }
    } else {
        match finding {
            Finding::None => {
                if let Some(at) = gate_site(verdict, accumulated, th) {
                    let exact_stages = th.stage_exact
                        && accumulated
                            .is_some_and(|c| !c.stages.is_empty() && first_inexact(c).is_none());
                    *finding = if at.stage == LOGITS && exact_stages {
                        Finding::Structural {
                            at,
                            floor: "bit equality: every stage up to the final norm equals the golden at its \
                                    storage precision, the logits computed from it do not"
                                .into(),
                            ratio: None,
                        }
                    } else {
                        Finding::AccumulatedDrift { at }
                    };
                    gate_finding(verdict, finding);
                }
            }
            Finding::NotLocalized { at: at @ None, .. } => {
                *at = gate_site(verdict, accumulated, th);
            }
            _ => {}
        }
    }
    match finding {
        Finding::Tokens { .. } => {}
        f => verdict.first_divergent = f.site().cloned(),
    }
}

/// The stage id a divergence at the logits is placed at ([`gate_site`]).
pub const LOGITS: &str = "logits";

/// Where the accumulated pass first leaves the gate of a failing cell: the gate's own first divergent
/// stage (the stage cutoffs, bit equality, a NaN), else the first layer output / final norm in forward order
/// whose cosine is below `min_cosine_out`, else the logits at the first position of the first failing
/// logits metric (a top-1 mismatch; the largest KL; the lowest top-5 overlap) — cosine and NMSE NaN there,
/// the logits having none measured. `None` when the comparison places nothing (no stage, no logits).
pub fn gate_site(
    verdict: &Verdict,
    accumulated: Option<&CellComparison>,
    th: &CellThresholds,
) -> Option<Divergence> {
    if let Some(d) = verdict
        .first_divergent
        .as_ref()
        .filter(|d| d.stage != crate::gate::verdict::TOKENS_MARKER)
    {
        return Some(d.clone());
    }
    let cmp = accumulated?;
    for phase in [Phase::Prefill, Phase::Decode] {
        for s in cmp
            .stages
            .iter()
            .filter(|s| s.phase == phase && crate::gate::is_out_stage(&s.stage))
        {
            if let Some(row) = s
                .cosine_by_position
                .iter()
                .position(|&c| c < th.min_cosine_out || c.is_nan())
            {
                return Some(divergence(cmp, s, row));
            }
        }
    }
    let m = crate::gate::cell_metrics(cmp, th.margin_tolerance);
    let at = |phase: Phase, position: usize| Divergence {
        stage: LOGITS.into(),
        phase,
        position,
        cosine: f64::NAN,
        nmse: f64::NAN,
    };
    for f in &verdict.failures {
        let site = match f.metric.as_str() {
            "top1_agreement" => m.mismatches.first().map(|p| at(p.phase, p.pos.position)),
            "mean_kl" | "max_kl" => m.max_kl.map(|(_, ph, pos)| at(ph, pos)),
            "top5_mean" => m.worst_top5.map(|(_, ph, pos)| at(ph, pos)),
            _ => None,
        };
        if site.is_some() {
            return site;
        }
    }
    None
}

/// The verdict on a cell whose accumulated pass is `acc`: the local pass, its hits above the floor in
/// forward order, and — in reference mode — ggml mode's local pass to tell llama.cpp's own rounding from a
/// bug. `lockstep run` calls this for its first-divergent column.
pub fn judge(
    case: &Case,
    gf: &mut GoldenFile,
    engine: &mut dyn Engine,
    mode: NumericsMode,
    th: &CellThresholds,
    floors: Option<&FloorSet>,
    acc: &Pass,
) -> Result<Judged> {
    // other tokens make every later comparison moot: the first differing token is the verdict
    if let Some(finding) = case.tokens_finding(engine) {
        return Ok(Judged {
            finding,
            local: None,
        });
    }
    // a bit-exact accumulated pass needs no local one: with the same inputs it computes the same values
    if th.stage_exact && acc.cmp.as_ref().is_some_and(|c| first_inexact(c).is_none()) {
        return Ok(Judged {
            finding: Finding::None,
            local: None,
        });
    }
    if !engine.replaces_stages() {
        // no `inject`: the accumulated pass is all there is, and it cannot say where an error enters
        return Ok(Judged {
            finding: not_localized(NoLocalPass::NoInject, th, acc.cmp.as_ref()),
            local: None,
        });
    }
    if !case.bisectable() {
        // no layer output to inject: the accumulated pass is all there is
        return Ok(Judged {
            finding: not_localized(NoLocalPass::NoLayerOutputs, th, acc.cmp.as_ref()),
            local: None,
        });
    }
    let (local, known) = case.local(gf, engine, mode, acc)?;
    let cmp = local
        .cmp
        .as_ref()
        .expect("the local pass is always compared");
    // rows above a kind's 99th percentile are read against ggml mode only where ggml mode reproduces the
    // oracle (reference mode against llama.cpp); elsewhere the floor must cover the largest measured row
    let cross_checked =
        mode == NumericsMode::Reference && floors.is_some() && gf.entry().oracle.is_llama_cpp();
    let statistic = if cross_checked {
        FloorStatistic::P99
    } else {
        FloorStatistic::Max
    };
    let hits = hits(&known, th, floors, statistic, cmp)?;
    let non_finite = |nf: &NonFinite| Finding::Structural {
        at: nf.divergence(),
        floor: format!("finite values: {}", nf.describe()),
        ratio: None,
    };
    let finding = if cross_checked {
        match cross_check(case, gf, engine, cmp, &hits)? {
            CrossCheck::Structural(f) => f,
            // a NaN or ±Inf after every compared stage stayed within its floor is the finding itself
            _ if local.nf.is_some() => non_finite(local.nf.as_ref().expect("checked")),
            CrossCheck::Rounding(sites) if !sites.is_empty() => {
                confirm_rounding(case, gf, engine, th, floors, acc, sites)?
            }
            _ => drift(th, acc.cmp.as_ref()),
        }
    } else {
        match (hits.first(), &local.nf) {
            (Some(h), _) => h.finding(cmp),
            (None, Some(nf)) => non_finite(nf),
            (None, None) => drift(th, acc.cmp.as_ref()),
        }
    };
    let mut finding = finding;
    if let (Finding::Structural { floor, .. }, Some(note)) = (&mut finding, case.target_note()) {
        if floor.contains("bit equality") || floor.contains("bit for bit") {
            *floor = format!("{floor} — but {note}");
        }
    }
    Ok(Judged {
        finding,
        local: local.cmp,
    })
}

/// A row of the local pass above its floor.
struct Hit {
    stage: String,
    phase: Phase,
    row: usize,
    /// Local NMSE ÷ the floor (`None` where the floor is bit equality).
    ratio: Option<f64>,
    floor: String,
}

impl Hit {
    fn finding(&self, cmp: &CellComparison) -> Finding {
        let s = cmp
            .stages
            .iter()
            .find(|s| s.stage == self.stage && s.phase == self.phase)
            .expect("a hit names a compared stage");
        Finding::Structural {
            at: divergence(cmp, s, self.row),
            floor: self.floor.clone(),
            ratio: self.ratio,
        }
    }
}

/// Every row of the local pass above its floor, in forward order (prefill, then decode):
///
/// - bit equality at the golden's storage precision where the cell's floor is bit equality
///   (`stage_exact`) or the measured floors say the stage was always exact ([`FloorSet::exact_at`]) —
///   provided the row's injected input is the oracle's exact value;
/// - else the measured floor: local NMSE above `stage_floor_headroom ×` the stage kind's `statistic`
///   ([`FloorStatistic`]: its 99th percentile where rows above it are cross-checked, else its maximum);
/// - else (no floors for the cell) the stage cutoffs `stage_min_cosine` / `stage_max_nmse`.
fn hits(
    known: &Known,
    th: &CellThresholds,
    floors: Option<&FloorSet>,
    statistic: FloorStatistic,
    local: &CellComparison,
) -> Result<Vec<Hit>> {
    let mut out = Vec::new();
    for phase in [Phase::Prefill, Phase::Decode] {
        for s in local.stages.iter().filter(|s| s.phase == phase) {
            let exact_floor = th.stage_exact || floors.is_some_and(|f| f.exact_at(&s.stage));
            let kind = match floors {
                Some(f) if !th.stage_exact => Some(f.kind(&s.stage)?),
                _ => None,
            };
            for row in 0..s.cosine_by_position.len() {
                let nmse = s.nmse_by_position.get(row).copied().unwrap_or(f64::NAN);
                let hit = if exact_floor
                    && s.id().is_some_and(|id| input_known(known, phase, id, row))
                {
                    (!s.exact_at_storage_by_position.get(row).copied().unwrap_or(false)).then(|| {
                        (
                            None,
                            "bit equality at the golden's storage precision (the layer's exact input injected)"
                                .to_string(),
                        )
                    })
                } else if let (Some(k), Some(h)) = (kind, th.stage_floor_headroom) {
                    // f32 storage and the oracle's exact input: held to the clean rows' floor
                    let clean = s.storage == Some(crate::npz::Dtype::F32)
                        && s.id().is_some_and(|id| input_known(known, phase, id, row));
                    let base = k.statistic(statistic, clean);
                    let floor = h * base;
                    (nmse > floor || nmse.is_nan()).then(|| {
                        (
                            Some(nmse / floor),
                            format!(
                                "measured floor NMSE {} ({h} × {}{} {} of `{}` over {} rows)",
                                fmt_e3(floor),
                                statistic.name(),
                                if clean && base != k.statistic(statistic, false) {
                                    " of the f32-stored rows with an exact input"
                                } else {
                                    ""
                                },
                                fmt_e3(base),
                                kind_of(&s.stage),
                                k.rows
                            ),
                        )
                    })
                } else {
                    let cos = s.cosine_by_position[row];
                    let bad = cos < th.stage_min_cosine
                        || cos.is_nan()
                        || th.stage_max_nmse.is_some_and(|m| nmse > m || nmse.is_nan());
                    bad.then(|| {
                        (
                            None,
                            format!(
                                "stage cutoffs (cosine < {}, NMSE > {})",
                                th.stage_min_cosine,
                                th.stage_max_nmse.map_or("-".into(), |m| format!("{m:e}"))
                            ),
                        )
                    })
                };
                if let Some((ratio, floor)) = hit {
                    out.push(Hit {
                        stage: s.stage.clone(),
                        phase,
                        row,
                        ratio,
                        floor,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// No local error above the floor: the accumulated pass's first divergent stage, if any, is drift.
fn drift(th: &CellThresholds, accumulated: Option<&CellComparison>) -> Finding {
    let Some(accumulated) = accumulated else {
        return Finding::None;
    };
    let first = if th.stage_exact {
        first_inexact(accumulated)
    } else {
        first_divergent(accumulated, th.stage_min_cosine, th.stage_max_nmse)
    };
    match first {
        Some(at) => Finding::AccumulatedDrift { at },
        None => Finding::None,
    }
}

fn divergence(cmp: &CellComparison, s: &StageComparison, row: usize) -> Divergence {
    Divergence {
        stage: s.stage.clone(),
        phase: s.phase,
        position: seq_position(cmp, s, row),
        cosine: s.cosine_by_position[row],
        nmse: s.nmse_by_position.get(row).copied().unwrap_or(f64::NAN),
    }
}
