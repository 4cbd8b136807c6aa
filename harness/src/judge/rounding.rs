//! Oracle-side rounding: telling llama.cpp's own 8-bit rounding of matmul inputs from a bug. Ggml mode's
//! local pass cross-checks reference mode's rows above the floor ([`cross_check`]), the golden's matmul
//! input rows give the evidence ([`evidence`], [`q8_rounding`]), and reference mode rerun with that rounding
//! confirms it ([`confirm_rounding`]).

use anyhow::Result;
use lockstep_engine::{NumericsMode, Stage};

use crate::capture::{input_known, Known};
use crate::compare::{CellComparison, EngineOutput, Phase};
use crate::engine::Engine;
use crate::floors::{FloorSet, FloorStatistic};
use crate::format::fmt_e3;
use crate::gate::CellThresholds;
use crate::golden::{array_stage, GoldenFile};

use super::case::{Case, Pass};
use super::finding::{Finding, RoundingEvidence};
use super::{divergence, hits, Hit};

/// Ggml mode's local pass on `case` (with its accumulated pass first where f16-stored layer outputs need
/// ggml mode's own rows to be injected exactly).
fn ggml_local(case: &Case, gf: &mut GoldenFile, engine: &mut dyn Engine) -> Result<(Pass, Known)> {
    let g_acc = if case.injects_f16() {
        case.accumulated(gf, engine, NumericsMode::Ggml)?
    } else {
        Pass {
            out: EngineOutput::default(),
            nf: None,
            cmp: None,
        }
    };
    case.local(gf, engine, NumericsMode::Ggml, &g_acc)
}

/// Reference mode's own check of the rows the cross-check put down to llama.cpp's rounding: its local
/// pass rerun with llama.cpp's input rounding ([`Engine::set_input_rounding`], the rounding probe's
/// switch) and nothing else changed. Each such row must then fall within its floor.
///
/// The cross-check runs ggml mode's fastest kernels, which share no dot product or dequantization code
/// with reference mode's at the cell's SIMD setting; the rerun runs reference mode's own code. A bug there
/// (a scalar-only unpack error) leaves its row above the floor with the rounding added, while ggml mode
/// matched the golden: the two kernels disagree, and that is a structural finding, named at the rerun's
/// first such row. An engine that cannot round its inputs keeps the verdict, unconfirmed
/// (`rounded_nmse` is `None`).
///
/// Errors: as the local pass.
pub(super) fn confirm_rounding(
    case: &Case,
    gf: &mut GoldenFile,
    engine: &mut dyn Engine,
    th: &CellThresholds,
    floors: Option<&FloorSet>,
    acc: &Pass,
    sites: Vec<(RoundingEvidence, usize)>,
) -> Result<Finding> {
    if !engine.set_input_rounding(true) {
        return Ok(Finding::OracleRounding {
            sites: sites.into_iter().map(|(e, _)| e).collect(),
        });
    }
    // the decode steps only where a row to confirm is in decode (reference mode's decode is the costly
    // part: every weight row dequantized per step)
    let decode = sites.iter().any(|(e, _)| e.at.phase == Phase::Decode);
    let rerun = case.local_with(gf, engine, NumericsMode::Reference, acc, decode);
    engine.set_input_rounding(false);
    let (r_local, r_known) = rerun?;
    let r_cmp = r_local
        .cmp
        .as_ref()
        .expect("the local pass is always compared");
    let r_hits = hits(&r_known, th, floors, FloorStatistic::P99, r_cmp)?;
    let mut confirmed = Vec::with_capacity(sites.len());
    for (mut ev, row) in sites {
        let (stage, phase) = (ev.at.stage.clone(), ev.at.phase);
        let rounded = r_cmp
            .stages
            .iter()
            .find(|s| s.stage == stage && s.phase == phase);
        let still = r_hits
            .iter()
            .find(|h| h.stage == stage && h.phase == phase && h.row == row);
        match (rounded, still) {
            (Some(s), None) => {
                ev.rounded_nmse = s.nmse_by_position.get(row).copied();
                confirmed.push(ev);
            }
            (Some(s), Some(h)) => {
                return Ok(Finding::Structural {
                    at: divergence(r_cmp, s, row),
                    floor: format!(
                        "{} — with llama.cpp's input rounding added, reference mode still misses this row, \
                         where ggml mode's {} kernels equal the golden bit for bit: not llama.cpp's rounding \
                         but reference-mode code those kernels do not share (its local NMSE without the \
                         rounding: {})",
                        h.floor,
                        lockstep_engine::Simd::detect().name(),
                        fmt_e3(ev.at.nmse)
                    ),
                    ratio: h.ratio,
                });
            }
            // the rerun went non-finite before this stage: nothing confirms the row
            (None, _) => {
                return Ok(Finding::Structural {
                    at: ev.at.clone(),
                    floor: format!(
                        "a finite value: reference mode with llama.cpp's input rounding {}",
                        r_local
                            .non_finite()
                            .unwrap_or_else(|| "did not compute this stage".into())
                    ),
                    ratio: ev.ratio,
                });
            }
        }
    }
    Ok(Finding::OracleRounding { sites: confirmed })
}

/// What ggml mode says about a reference-mode local pass.
pub(super) enum CrossCheck {
    /// A bug: the first row where ggml mode differs from the golden although its input was exact (a code
    /// path both modes share), or where reference mode is above its floor and ggml mode gives no reason.
    Structural(Finding),
    /// Every reference-mode row above the floor is one where ggml mode equals the golden bit for bit (the
    /// evidence, and the row's index in its stage).
    Rounding(Vec<(RoundingEvidence, usize)>),
}

/// Run ggml mode's local pass on the same golden and read reference mode's hits against it, in forward
/// order. llama.cpp rounds every matmul input to 8 bits; ggml mode does the same, bit for bit, and shares
/// every other line of code with reference mode (norms, RoPE, attention, activations, residual adds). So:
///
/// - a row where ggml mode is not bit-exact although its injected input was exact is a bug in a shared path,
///   however far below reference mode's floor it sits (a RoPE position off by one in decode moves a layer's
///   output by less than reference mode's rounding noise, and ggml mode still sees it);
/// - a reference-mode row above its floor where ggml mode is bit-exact is llama.cpp's rounding, not ours —
///   oracle-side rounding, with the evidence ([`evidence`]);
/// - a reference-mode row above its floor where ggml mode cannot vouch for it (inexact input) is a bug.
///
/// Errors: the golden records no host CPU (ggml mode has no target), or as the passes.
pub(super) fn cross_check(
    case: &Case,
    gf: &mut GoldenFile,
    engine: &mut dyn Engine,
    cmp: &CellComparison,
    hits: &[Hit],
) -> Result<CrossCheck> {
    // ggml mode gives the same bits under every SIMD setting (the report's "SIMD vs scalar" table checks
    // it cell by cell), so its passes here run the fastest kernels the CPU has; the cell's own setting is
    // restored whatever happens
    let previous = engine.set_simd(lockstep_engine::Simd::detect());
    let passes = ggml_local(case, gf, engine);
    if let Some(simd) = previous {
        engine.set_simd(simd);
    }
    let (g_local, g_known) = passes?;
    let g_cmp = g_local
        .cmp
        .as_ref()
        .expect("the local pass is always compared");
    let mut sites = Vec::new();
    for phase in [Phase::Prefill, Phase::Decode] {
        for g in g_cmp.stages.iter().filter(|s| s.phase == phase) {
            for row in 0..g.exact_at_storage_by_position.len() {
                let g_known_row = g
                    .id()
                    .is_some_and(|id| input_known(&g_known, phase, id, row));
                let g_exact = g.exact_at_storage_by_position[row];
                let hit = hits
                    .iter()
                    .find(|h| h.stage == g.stage && h.phase == phase && h.row == row);
                if g_known_row && !g_exact {
                    let mine = cmp
                        .stages
                        .iter()
                        .find(|s| s.stage == g.stage && s.phase == phase);
                    let at = match mine {
                        Some(s) => divergence(cmp, s, row),
                        None => divergence(g_cmp, g, row),
                    };
                    return Ok(CrossCheck::Structural(Finding::Structural {
                        at,
                        floor: "bit equality in ggml mode, which shares this stage's code with reference mode and \
                                reproduces llama.cpp bit for bit (the layer's exact input injected)"
                            .into(),
                        ratio: hit.and_then(|h| h.ratio),
                    }));
                }
                match hit {
                    Some(h) if g_known_row && g_exact => sites.push((evidence(gf, cmp, h)?, h.row)),
                    Some(h) => return Ok(CrossCheck::Structural(h.finding(cmp))),
                    None => {}
                }
            }
        }
    }
    // reference-mode hits at stages ggml mode did not compare (it went non-finite first) are unexplained
    if let Some(h) = hits.iter().find(|h| {
        !g_cmp
            .stages
            .iter()
            .any(|g| g.stage == h.stage && g.phase == h.phase)
    }) {
        return Ok(CrossCheck::Structural(h.finding(cmp)));
    }
    Ok(CrossCheck::Rounding(sites))
}

/// NMSE of rounding `x` to 8 bits per 32-element block with scale `amax / 127` (Q8_1's and, per 32,
/// Q8_K's rounding: `quantize_row_q8_1_ref` in ggml-quants.c), and the row's crest factor `max|x| / rms`.
pub fn q8_rounding(x: &[f32]) -> (f64, f64) {
    let (mut err, mut sig, mut amax_all) = (0f64, 0f64, 0f64);
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for &v in b {
            let q = (v * id).round();
            let e = f64::from(v) - f64::from(q * d);
            err += e * e;
            sig += f64::from(v) * f64::from(v);
        }
        amax_all = amax_all.max(f64::from(amax));
    }
    let rms = (sig / x.len().max(1) as f64).sqrt();
    (
        if sig > 0.0 { err / sig } else { 0.0 },
        if rms > 0.0 { amax_all / rms } else { 0.0 },
    )
}

/// The evidence that a hit is llama.cpp's activation rounding: the golden's matmul input row there, how
/// extreme it is and what 8-bit rounding does to it, against the median row of the same stage kind.
fn evidence(gf: &mut GoldenFile, cmp: &CellComparison, h: &Hit) -> Result<RoundingEvidence> {
    let s = cmp
        .stages
        .iter()
        .find(|s| s.stage == h.stage && s.phase == h.phase)
        .expect("a hit names a compared stage");
    let at = divergence(cmp, s, h.row);
    let mut ev = RoundingEvidence {
        at,
        ratio: h.ratio,
        input: None,
        input_crest: None,
        input_q8_nmse: None,
        median_q8_nmse: None,
        rounded_nmse: None,
    };
    // the activation llama.cpp rounded before the product whose error the stage carries
    let Some(input) = s.id().and_then(Stage::matmul_input) else {
        return Ok(ev);
    };
    let prefix = if h.phase == Phase::Decode {
        "decode."
    } else {
        ""
    };
    let name = format!("{prefix}{input}");
    if !gf.entry().arrays.contains_key(&name) {
        return Ok(ev);
    }
    let rows = gf.read_f32(&name)?;
    if let Some(row) = rows.outer_iter().nth(h.row) {
        let (n, c) = q8_rounding(&row.to_vec());
        ev.input_q8_nmse = Some(n);
        ev.input_crest = Some(c);
    }
    // the same kind in every layer the golden stores, this phase
    let names: Vec<String> = gf
        .entry()
        .arrays
        .keys()
        .filter(|k| {
            array_stage(k).is_some_and(|(id, decode)| {
                id.layer.is_some() && id.kind == input.kind && decode == (h.phase == Phase::Decode)
            })
        })
        .cloned()
        .collect();
    let mut all = Vec::new();
    for n in names {
        for r in gf.read_f32(&n)?.outer_iter() {
            all.push(q8_rounding(&r.to_vec()).0);
        }
    }
    all.sort_by(f64::total_cmp);
    ev.median_q8_nmse = all.get(all.len() / 2).copied();
    ev.input = Some(input.to_string());
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_rounding_of_a_flat_row_is_tiny_and_an_outlier_makes_it_coarse() {
        // 32 equal values: each is exactly ±127 steps, no rounding error; crest factor 1
        let (n, c) = q8_rounding(&[0.5; 32]);
        assert_eq!(n, 0.0);
        assert!((c - 1.0).abs() < 1e-12);
        // one element 100× the rest in the block: the step is amax/127, the small ones round to 0 or ±1
        let mut x = vec![0.015f32; 32];
        x[0] = 1.3;
        let (n_out, c_out) = q8_rounding(&x);
        let (n_flat, _) =
            q8_rounding(&(0..32).map(|i| 0.01 + 0.001 * i as f32).collect::<Vec<_>>());
        assert!(c_out > 5.0, "crest {c_out}");
        assert!(n_out > 10.0 * n_flat, "{n_out} vs {n_flat}");
    }
}
