//! The rounding probe: how much of a reference-mode gap to llama.cpp is llama.cpp's own input rounding.
//!
//! Reference mode keeps every matmul input in f32; llama.cpp rounds it first to the weight type's
//! `vec_dot_type` (Q8_0 / Q8_1 / Q8_K, 8 bits per element; F16, BF16), ggml-cpu's
//! `ggml_compute_forward_mul_mat` → `from_float`. Where a reference cell fails its gate, `lockstep run`
//! reruns the cell with that rounding and nothing else of ggml's arithmetic
//! ([`lockstep_engine::quant::PreparedRow::prepare_rounded`]) and gates the rerun with the cell's own
//! thresholds. A porting bug (a wrong RoPE base, a wrong epsilon, a misplaced norm) does not shrink when
//! llama.cpp's rounding is added; a gap that shrinks to the thresholds was that rounding's sensitivity.
//! The probe is informative: it never changes the cell's verdict.

use anyhow::Result;
use lockstep_engine::NumericsMode;
use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::gate::{cell_metrics, evaluate, CellThresholds, Verdict};
use crate::golden::GoldenFile;
use crate::judge::Case;
use crate::matrix::Cell;

/// The rerun of a failing reference cell with llama.cpp's input rounding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundingProbe {
    /// Logits positions compared (prefill and decode).
    pub positions: usize,
    /// Positions whose top-1 token agrees with the golden's.
    pub top1_agree: usize,
    /// Mean KL(golden ‖ probe) in nats over the positions with full golden rows; `None` without any.
    pub mean_kl: Option<f64>,
    /// The largest KL (nats).
    pub max_kl: Option<f64>,
    /// Mean top-5 overlap.
    pub top5_mean: Option<f64>,
    /// The probe gated with the cell's own thresholds (what the cell's verdict would be, had reference
    /// mode rounded its inputs as llama.cpp does). Informative only.
    pub verdict: Verdict,
}

/// Whether `cell` gets a probe: reference mode, a failed verdict, an engine that can round its inputs.
pub fn wanted(mode: NumericsMode, verdict: &Verdict) -> bool {
    mode == NumericsMode::Reference && !verdict.pass
}

/// Run the probe: `engine` rerun on `case` with its inputs rounded ([`Engine::set_input_rounding`]),
/// compared with the golden and gated with `th`. `None` when the engine cannot round its inputs (an
/// external engine) or the rerun's output is not finite; the engine is left with rounding off.
///
/// Errors: the engine's or the comparison's.
pub fn run(
    case: &Case,
    gf: &mut GoldenFile,
    engine: &mut dyn Engine,
    cell: &Cell,
    th: &CellThresholds,
) -> Result<Option<RoundingProbe>> {
    if !engine.set_input_rounding(true) {
        return Ok(None);
    }
    let pass = case.accumulated(gf, engine, NumericsMode::Reference);
    engine.set_input_rounding(false);
    let Some(cmp) = pass?.cmp else {
        return Ok(None);
    };
    let m = cell_metrics(&cmp, th.margin_tolerance);
    Ok(Some(RoundingProbe {
        positions: m.positions,
        top1_agree: m.top1_agree,
        mean_kl: m.mean_kl,
        max_kl: m.max_kl.map(|x| x.0),
        top5_mean: m.top5_mean,
        verdict: evaluate(cell, &cmp, th),
    }))
}
