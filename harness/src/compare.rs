//! One comparison engine: an engine's stages and logits against a golden, stage by stage and position by
//! position, for the prefill and the teacher-forced decode steps.
//!
//! Every stage is accounted for: compared (with [`StageComparison`] metrics), or listed in
//! [`CellComparison::not_compared`] with the reason (the oracle has no such node, the golden did not store
//! it, the engine does not emit it). A shape disagreement or a non-finite value is an error naming the file
//! or stage, never a skipped comparison.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use lockstep_engine::Stage;
use ndarray::Array2;
use serde::{Deserialize, Serialize};

use crate::golden::{GoldenFile, StageMap};
use crate::metrics::{
    first_non_finite, logit_position, row_error, LogitPosition, RefLogits, Summary,
};
use crate::npz::Dtype;

/// The [`NotCompared::reason`] of a stage the golden holds and the engine's stage list names, but the
/// engine did not hand over.
pub const ENGINE_DID_NOT_EMIT: &str = "the engine did not emit it";

/// The [`NotCompared::reason`] of a stage the golden holds that is not in the engine's stage list.
pub const ENGINE_HAS_NO_SUCH_STAGE: &str = "the engine does not emit this stage";

/// The [`NotCompared::reason`] of a name an engine dumped that maps to no canonical id (no entry of its
/// stage map, or not a canonical id when it has none: [`crate::protocol::stage_map`]).
pub const NOT_IN_STAGE_MAP: &str =
    "the engine's own name maps to no canonical stage id (add it to the stage map)";

/// The [`NotCompared::reason`] of `tokens` when the engine does not tokenize (a session engine without
/// the `tokenize` capability): the ids it ran are lockstep's tokenization, so the engine's is not tested.
pub const TOKENS_NOT_FROM_ENGINE: &str =
    "the engine does not tokenize (no `tokenize` capability): lockstep's tokenizer gave the ids it ran";

/// The [`NotCompared::reason`] of `logits` in the comparison of an encoder's golden ([`GoldenEntry::is_encoder`]
/// of [`crate::golden`]): there are none; the model's output is compared as the stage `pooled`.
pub const ENCODER_NO_LOGITS: &str =
    "an encoder has no logits: its output, the pooled embedding, is compared as the stage `pooled` (cosine, NMSE, bits)";

/// The [`NotCompared::reason`] of an encoder–decoder model's stages in the decode phase that are computed once
/// per input, before the prompt (`mel`, `enc.…`, `blk.N.cross_k` / `cross_v`: Whisper): compared with the prefill's.
pub const ONCE_PER_INPUT: &str =
    "computed once per input, before the prompt (the audio's encoder and cross K/V): compared in the prefill";

/// True for a stage an encoder–decoder model computes once per input ([`ONCE_PER_INPUT`]).
fn once_per_input(s: Stage) -> bool {
    use lockstep_engine::StageKind;
    s.enc
        || matches!(
            s.kind,
            StageKind::Mel | StageKind::CrossK | StageKind::CrossV
        )
}

/// Prefill (all prompt positions in one batch) or decode (one token per step through the KV cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The prompt, one forward call.
    Prefill,
    /// Teacher-forced decode steps.
    Decode,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        })
    }
}

/// What an engine produced for one golden: stages and logits of the prefill and of each decode step.
#[derive(Clone, Debug, Default)]
pub struct EngineOutput {
    /// The engine's own tokenization of the golden's prompt text.
    pub own_tokens: Vec<u32>,
    /// Prefill stages by canonical id, `[T, D]`; `logits` is `[T, V]`.
    pub prefill: BTreeMap<String, Array2<f32>>,
    /// Decode stages by canonical id, one row per step, `[N, D]`; `logits` is `[N, V]`.
    pub decode: BTreeMap<String, Array2<f32>>,
    /// The engine's stage ids in forward order (excluding `logits`).
    pub stage_order: Vec<String>,
    /// What the engine could not give, `(name, reason)` ([`crate::engine::Engine::not_compared`]: names
    /// that map to no canonical id, [`NOT_IN_STAGE_MAP`]; `tokens` from lockstep's tokenizer,
    /// [`TOKENS_NOT_FROM_ENGINE`]), listed under "not compared".
    pub engine_notes: Vec<(String, String)>,
    /// Wall-clock seconds of the prefill's `forward` call, stage hooks included (the recorder's copies;
    /// not the conversion of the recorded rows into arrays).
    pub prefill_seconds: f64,
    /// Wall-clock seconds of all decode steps' `forward` calls together, hooks included.
    pub decode_seconds: f64,
}

impl EngineOutput {
    /// sha256 (lowercase hex) of everything the engine computed: for each phase (`prefill`, then
    /// `decode`) and each array in id order, the id, its shape and the little-endian bits of every f32.
    /// Two runs have the same digest exactly when every stage and the logits are bit-identical — the
    /// "SIMD vs scalar" check of a report compares these.
    pub fn sha256(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for (phase, arrays) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            for (id, a) in arrays {
                h.update(format!("{phase}/{id}/{:?}\n", a.shape()).as_bytes());
                for v in a.iter() {
                    h.update(v.to_bits().to_le_bytes());
                }
            }
        }
        hex::encode(h.finalize())
    }
}

/// Metrics of one stage over the positions of one phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageComparison {
    /// Canonical id.
    pub stage: String,
    /// Prefill or decode.
    pub phase: Phase,
    /// Block index, for per-layer stages.
    pub layer: Option<usize>,
    /// Row width.
    pub width: usize,
    /// Cosine per position.
    pub cosine: Summary,
    /// NMSE per position.
    pub nmse: Summary,
    /// RMSE per position.
    pub rmse: Summary,
    /// Mean |Δ| per position.
    pub mean_abs: Summary,
    /// Max |Δ| over all positions.
    pub max_abs: f64,
    /// Every value equal.
    pub bit_exact: bool,
    /// The golden's storage type of this stage (`f32`, `f16`; reports of older versions lack it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<crate::npz::Dtype>,
    /// Per position: the engine's row, rounded to the golden's storage type as the oracle rounded its own
    /// f32 values (IEEE round to nearest even), equals the stored row bit for bit. The floor of a mode that
    /// reproduces the oracle exactly: any `false` is a difference, however small its NMSE.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exact_at_storage_by_position: Vec<bool>,
    /// Position of the smallest cosine (the prompt position, in a compact golden's comparison too).
    pub worst_position: usize,
    /// Cosine per position, in position order (for bisect and plots).
    pub cosine_by_position: Vec<f64>,
    /// NMSE per position, in position order.
    pub nmse_by_position: Vec<f64>,
    /// The prompt position of each row when the golden stores this stage at some positions only (a compact
    /// golden's `stage_positions`, [`crate::golden::GoldenEntry::is_compact`]): row `r` of the per-position
    /// vectors is position `positions[r]`. Empty when row `r` is position `r` (every position compared).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub positions: Vec<usize>,
}

impl StageComparison {
    /// The stage compared, typed ([`Stage::parse`] of [`StageComparison::stage`], the canonical id the
    /// report stores); `None` only for a name that is not a canonical id.
    pub fn id(&self) -> Option<Stage> {
        Stage::parse(&self.stage)
    }

    /// The largest NMSE over the positions (NaN if any is NaN; 0 without positions).
    pub fn max_nmse(&self) -> f64 {
        self.nmse_by_position
            .iter()
            .copied()
            .fold(0.0, |m: f64, x| if x > m || x.is_nan() { x } else { m })
    }

    /// The position in its phase of row `row` of the per-position vectors: [`StageComparison::positions`]
    /// where the golden stores some positions only, else `row` itself.
    pub fn row_position(&self, row: usize) -> usize {
        self.positions.get(row).copied().unwrap_or(row)
    }

    /// Every position equal to the golden at its storage precision (false when not measured).
    pub fn exact_at_storage(&self) -> bool {
        !self.exact_at_storage_by_position.is_empty()
            && self.exact_at_storage_by_position.iter().all(|&e| e)
    }
}

/// A stage that was not compared, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotCompared {
    /// Canonical id.
    pub stage: String,
    /// Prefill or decode.
    pub phase: Phase,
    /// Why not.
    pub reason: String,
}

/// Logit metrics of one phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogitsComparison {
    /// Prefill or decode.
    pub phase: Phase,
    /// Positions compared.
    pub n_positions: usize,
    /// Positions where the top-1 tokens agree.
    pub top1_agree: usize,
    /// Every position whose top-1 tokens differ, with the reference's margin. Which of them are near ties
    /// (margin below a tolerance) is the gate's call ([`crate::gate::cell_metrics`]): comparing measures,
    /// it does not judge.
    pub disagreements: Vec<LogitPosition>,
    /// KL(P_ref ‖ P_eng) over positions with full reference rows.
    pub kl: Option<Summary>,
    /// Top-5 overlap.
    pub top5: Summary,
    /// Top-10 overlap.
    pub top10: Summary,
    /// Reference entropy (full rows).
    pub entropy_ref: Option<Summary>,
    /// Engine entropy.
    pub entropy_eng: Summary,
    /// Δp of the reference's top token (full rows).
    pub dp_top: Option<Summary>,
    /// Every position's metrics.
    pub positions: Vec<LogitPosition>,
}

/// Everything one engine run says against one golden.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellComparison {
    /// The golden's token ids.
    pub golden_tokens: Vec<u32>,
    /// The engine's tokenization of the same text.
    pub engine_tokens: Vec<u32>,
    /// Compared stages, in forward order, prefill then decode.
    pub stages: Vec<StageComparison>,
    /// Stages not compared, with reasons.
    pub not_compared: Vec<NotCompared>,
    /// Logits per phase.
    pub logits: Vec<LogitsComparison>,
}

impl CellComparison {
    /// True when the engine tokenized the prompt exactly as the oracle did.
    pub fn tokens_match(&self) -> bool {
        self.golden_tokens == self.engine_tokens
    }

    /// True for the comparison of an encoder's golden: no logits ([`ENCODER_NO_LOGITS`]); the output is the
    /// stage `pooled`.
    pub fn is_encoder(&self) -> bool {
        self.not_compared
            .iter()
            .any(|n| n.stage == "logits" && n.reason == ENCODER_NO_LOGITS)
    }

    /// The comparison of the pooled embedding (an encoder's output), if it was compared.
    pub fn pooled(&self) -> Option<&StageComparison> {
        self.stages.iter().find(|s| s.stage == "pooled")
    }
}

/// Compare one stage's rows. Errors on a shape disagreement or a non-finite value, naming the stage.
pub fn compare_stage(
    stage: &str,
    phase: Phase,
    engine: &Array2<f32>,
    golden: &Array2<f32>,
    golden_name: &str,
) -> Result<StageComparison> {
    compare_stage_stored(stage, phase, engine, golden, golden_name, Dtype::F32)
}

/// The engine's value as the oracle would have stored it in `dtype` (f16: IEEE round to nearest even,
/// as numpy's `astype(float16)` does).
pub fn round_to_storage(x: f32, dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// [`compare_stage`] for a golden stored as `storage` (its rows widened to f32): also records, per
/// position, whether the engine's row rounded to `storage` equals the stored row bit for bit.
pub fn compare_stage_stored(
    stage: &str,
    phase: Phase,
    engine: &Array2<f32>,
    golden: &Array2<f32>,
    golden_name: &str,
    storage: Dtype,
) -> Result<StageComparison> {
    if engine.dim() != golden.dim() {
        bail!(
            "{golden_name}: stage `{stage}` ({phase}) has shape {:?} in the golden but {:?} from the engine",
            golden.dim(),
            engine.dim()
        );
    }
    let mut errs = Vec::with_capacity(engine.nrows());
    let mut exact = Vec::with_capacity(engine.nrows());
    for (p, (a, b)) in engine.rows().into_iter().zip(golden.rows()).enumerate() {
        exact.push(
            a.iter()
                .zip(b.iter())
                .all(|(&x, &y)| round_to_storage(x, storage).to_bits() == y.to_bits()),
        );
        let (a, b) = (a.to_vec(), b.to_vec());
        if let Some(nf) = first_non_finite(&a) {
            bail!(
                "engine stage `{stage}` ({phase}) holds {} at row {p}, column {} (compared against {golden_name})",
                nf.value,
                nf.index
            );
        }
        if let Some(nf) = first_non_finite(&b) {
            bail!(
                "{golden_name}: golden stage `{stage}` ({phase}) holds {} at row {p}, column {}",
                nf.value,
                nf.index
            );
        }
        errs.push(row_error(&a, &b));
    }
    let sum = |f: fn(&crate::metrics::RowError) -> f64| {
        Summary::of(errs.iter().map(f)).unwrap_or(Summary::EMPTY)
    };
    let worst_position = errs
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.cosine.total_cmp(&b.1.cosine))
        .map_or(0, |(i, _)| i);
    Ok(StageComparison {
        stage: stage.to_string(),
        phase,
        layer: layer_of(stage),
        width: engine.ncols(),
        cosine: sum(|e| e.cosine),
        nmse: sum(|e| e.nmse),
        rmse: sum(|e| e.rmse),
        mean_abs: sum(|e| e.mean_abs),
        max_abs: errs.iter().map(|e| e.max_abs).fold(0.0, f64::max),
        bit_exact: errs.iter().all(|e| e.bit_exact),
        storage: Some(storage),
        exact_at_storage_by_position: exact,
        worst_position,
        cosine_by_position: errs.iter().map(|e| e.cosine).collect(),
        nmse_by_position: errs.iter().map(|e| e.nmse).collect(),
        positions: Vec::new(),
    })
}

/// The block index of a canonical id (`blk.N.…`; [`Stage::parse`]); `None` for a global stage and for a
/// name that is not a canonical id.
pub fn layer_of(stage: &str) -> Option<usize> {
    Stage::parse(stage)?.layer
}

/// Summarise per-position logit metrics of one phase.
pub fn summarize_logits(phase: Phase, positions: Vec<LogitPosition>) -> LogitsComparison {
    let disagreements = positions
        .iter()
        .filter(|p| p.ref_top != p.eng_top)
        .cloned()
        .collect();
    let top1_agree = positions.iter().filter(|p| p.ref_top == p.eng_top).count();
    let empty = Summary::EMPTY;
    LogitsComparison {
        phase,
        n_positions: positions.len(),
        top1_agree,
        disagreements,
        kl: Summary::of(positions.iter().filter_map(|p| p.kl)),
        top5: Summary::of(positions.iter().map(|p| p.top5)).unwrap_or(empty),
        top10: Summary::of(positions.iter().map(|p| p.top10)).unwrap_or(empty),
        entropy_ref: Summary::of(positions.iter().filter_map(|p| p.entropy_ref)),
        entropy_eng: Summary::of(positions.iter().map(|p| p.entropy_eng)).unwrap_or(empty),
        dp_top: Summary::of(positions.iter().filter_map(|p| p.dp_top)),
        positions,
    }
}

fn logits_rows(engine: &Array2<f32>, what: &str, phase: Phase) -> Result<Vec<Vec<f32>>> {
    let mut rows = Vec::with_capacity(engine.nrows());
    for (p, r) in engine.rows().into_iter().enumerate() {
        let r = r.to_vec();
        if let Some(nf) = first_non_finite(&r) {
            bail!(
                "engine logits ({phase}) hold {} at row {p}, token {} ({what})",
                nf.value,
                nf.index
            );
        }
        rows.push(r);
    }
    Ok(rows)
}

/// Compare an engine's output with a golden. `stage_map` says which stages the oracle does not expose.
///
/// Errors: a golden array that is missing although the manifest lists it, a shape disagreement, a
/// non-finite value (engine or golden), the engine lacking logits — each naming the golden file or stage.
pub fn compare(
    golden: &mut GoldenFile,
    out: &EngineOutput,
    stage_map: Option<&StageMap>,
) -> Result<CellComparison> {
    compare_parts(golden, out, stage_map, true)
}

/// [`compare`] without the logits (`logits` is left empty): for a pass whose stages alone matter, such as
/// bisect's injected pass, which may have stopped being finite after the stages it compares.
pub fn compare_stages(
    golden: &mut GoldenFile,
    out: &EngineOutput,
    stage_map: Option<&StageMap>,
) -> Result<CellComparison> {
    compare_parts(golden, out, stage_map, false)
}

fn compare_parts(
    golden: &mut GoldenFile,
    out: &EngineOutput,
    stage_map: Option<&StageMap>,
    with_logits: bool,
) -> Result<CellComparison> {
    let gname = golden.path().display().to_string();
    let entry = golden.entry().clone();
    let golden_tokens = golden.read_tokens("tokens")?;
    // a compact golden: its prefill stages hold the rows of these prompt positions only
    let stage_positions = golden.stage_positions()?;
    let mut stages = Vec::new();
    let mut not_compared = Vec::new();
    let mut logits = Vec::new();

    for (phase, engine_stages) in [(Phase::Prefill, &out.prefill), (Phase::Decode, &out.decode)] {
        if phase == Phase::Decode && entry.n_decode_steps == 0 {
            continue;
        }
        let prefix = if phase == Phase::Decode {
            "decode."
        } else {
            ""
        };
        // the reference's forward order, not the engine's emission order (GoldenFile::forward_order)
        let golden_ids = golden.forward_order(phase == Phase::Decode);
        for id in &golden_ids {
            if !out.stage_order.contains(id) {
                not_compared.push(NotCompared {
                    stage: id.clone(),
                    phase,
                    reason: ENGINE_HAS_NO_SUCH_STAGE.into(),
                });
                continue;
            }
            let Some(e) = engine_stages.get(id) else {
                not_compared.push(NotCompared {
                    stage: id.clone(),
                    phase,
                    reason: ENGINE_DID_NOT_EMIT.into(),
                });
                continue;
            };
            let name = format!("{prefix}{id}");
            let storage = entry.arrays[&name].dtype;
            let g = golden.read_f32(&name)?;
            match (&stage_positions, phase) {
                (Some(pos), Phase::Prefill) => {
                    if e.nrows() != golden_tokens.len() {
                        bail!(
                            "{gname}: stage `{id}` ({phase}): {} prompt positions in the golden, {} rows from the engine",
                            golden_tokens.len(),
                            e.nrows()
                        );
                    }
                    let rows = e.select(ndarray::Axis(0), pos);
                    let mut c = compare_stage_stored(id, phase, &rows, &g, &gname, storage)?;
                    c.worst_position = pos[c.worst_position.min(pos.len() - 1)];
                    c.positions = pos.clone();
                    stages.push(c);
                }
                _ => stages.push(compare_stage_stored(id, phase, e, &g, &gname, storage)?),
            }
        }
        for id in &out.stage_order {
            if !golden_ids.contains(id) {
                let reason = if stage_map.is_some_and(|m| m.is_not_exposed(id)) {
                    "the oracle exposes no such node"
                } else if phase == Phase::Decode && Stage::parse(id).is_some_and(once_per_input) {
                    ONCE_PER_INPUT
                } else {
                    "not stored in this golden"
                };
                not_compared.push(NotCompared {
                    stage: id.clone(),
                    phase,
                    reason: reason.into(),
                });
            }
        }
        if phase == Phase::Prefill {
            for (name, reason) in &out.engine_notes {
                not_compared.push(NotCompared {
                    stage: name.clone(),
                    phase,
                    reason: reason.clone(),
                });
            }
        }

        // Logits.
        if !with_logits {
            continue;
        }
        if entry.is_encoder() {
            // said, not skipped: the report lists it, and the gate holds the pooled stage instead
            not_compared.push(NotCompared {
                stage: "logits".into(),
                phase,
                reason: ENCODER_NO_LOGITS.into(),
            });
            continue;
        }
        let Some(eng) = engine_stages.get("logits") else {
            bail!("the engine produced no {phase} logits (comparing against {gname})");
        };
        let rows = logits_rows(eng, &gname, phase)?;
        let mut positions = Vec::with_capacity(rows.len());
        match phase {
            Phase::Prefill => {
                let full = golden.read_f32("logits")?;
                if entry.is_audio() {
                    // an audio golden holds full logits at every prompt position (verified: [T, V])
                    if full.dim() != eng.dim() {
                        bail!(
                            "{gname}: logits {:?} in the golden, {:?} from the engine",
                            full.dim(),
                            eng.dim()
                        );
                    }
                    for (t, row) in rows.iter().enumerate() {
                        let r = full.row(t).to_vec();
                        positions.push(logit_position(t, row, RefLogits::Full(&r)));
                    }
                    logits.push(summarize_logits(phase, positions));
                    continue;
                }
                let full_pos = golden.read_tokens("logits_positions")?;
                let ids = golden.read_ids("logits_topk_ids", full.ncols())?;
                let vals = golden.read_f32("logits_topk")?;
                if rows.len() != golden_tokens.len() || ids.nrows() != rows.len() {
                    bail!("{gname}: {} prompt positions in the golden, {} logits rows from the engine", ids.nrows(), rows.len());
                }
                if ids.ncols() == 0 || vals.dim() != ids.dim() {
                    bail!(
                        "{gname}: logits_topk_ids {:?} and logits_topk {:?} must be equal, non-empty shapes",
                        ids.dim(),
                        vals.dim()
                    );
                }
                if full.ncols() != eng.ncols() {
                    bail!(
                        "{gname}: vocabulary {} in the golden, {} from the engine",
                        full.ncols(),
                        eng.ncols()
                    );
                }
                for (t, row) in rows.iter().enumerate() {
                    let lp = match full_pos.iter().position(|&p| p as usize == t) {
                        Some(i) => {
                            let r = full.row(i).to_vec();
                            logit_position(t, row, RefLogits::Full(&r))
                        }
                        None => {
                            let idv = ids.row(t).to_vec();
                            let vv = vals.row(t).to_vec();
                            logit_position(t, row, RefLogits::TopK(&idv, &vv))
                        }
                    };
                    positions.push(lp);
                }
            }
            // Full decode rows where the golden stores them, else its top-k per step (goldens of
            // large-vocabulary models keep full rows for one prompt only: oracles/README.md).
            Phase::Decode if golden.entry().arrays.contains_key("decode.logits") => {
                let full = golden.read_f32("decode.logits")?;
                if full.dim() != eng.dim() {
                    bail!(
                        "{gname}: decode logits {:?} in the golden, {:?} from the engine",
                        full.dim(),
                        eng.dim()
                    );
                }
                let t0 = golden_tokens.len();
                for (i, row) in rows.iter().enumerate() {
                    let r = full.row(i).to_vec();
                    positions.push(logit_position(t0 + i, row, RefLogits::Full(&r)));
                }
            }
            Phase::Decode => {
                let ids = golden.read_ids("logits_decode_topk_ids", eng.ncols())?;
                let vals = golden.read_f32("logits_decode_topk")?;
                if ids.nrows() != rows.len() || vals.dim() != ids.dim() || ids.ncols() == 0 {
                    bail!(
                        "{gname}: {} decode steps of top-k logits in the golden, {} from the engine",
                        ids.nrows(),
                        rows.len()
                    );
                }
                let t0 = golden_tokens.len();
                for (i, row) in rows.iter().enumerate() {
                    let idv = ids.row(i).to_vec();
                    let vv = vals.row(i).to_vec();
                    positions.push(logit_position(t0 + i, row, RefLogits::TopK(&idv, &vv)));
                }
            }
        }
        logits.push(summarize_logits(phase, positions));
    }
    Ok(CellComparison {
        golden_tokens,
        engine_tokens: out.own_tokens.clone(),
        stages,
        not_compared,
        logits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn stage_metrics_and_errors() {
        let e = array![[1.0f32, 2.0], [3.0, 4.0]];
        let c = compare_stage("blk.3.out", Phase::Prefill, &e, &e, "g.npz").unwrap();
        assert!(c.bit_exact && c.cosine.min > 0.999_999 && c.layer == Some(3));
        let g = array![[1.0f32, 2.0], [3.0, 5.0]];
        let c = compare_stage("blk.3.out", Phase::Prefill, &e, &g, "g.npz").unwrap();
        assert_eq!(c.worst_position, 1);
        assert_eq!(c.max_abs, 1.0);
        let bad = array![[1.0f32, f32::NAN], [3.0, 4.0]];
        let err = compare_stage("blk.3.out", Phase::Prefill, &bad, &g, "g.npz")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("engine stage `blk.3.out`") && err.contains("NaN"),
            "{err}"
        );
        let wrong = array![[1.0f32, 2.0, 3.0]];
        let err = compare_stage("blk.3.out", Phase::Prefill, &wrong, &g, "g.npz")
            .unwrap_err()
            .to_string();
        assert!(err.contains("g.npz") && err.contains("shape"), "{err}");
    }
}
