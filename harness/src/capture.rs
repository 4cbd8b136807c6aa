//! Capture: an engine's stages as arrays, in forward order, checked for non-finite values; and the
//! injection of a golden's layer inputs through the engine's replace hook.
//!
//! What every path that runs an engine needs between the engine seam ([`crate::engine`]) and the
//! comparison: turning a [`Recorder`]'s stages into `[rows, width]` arrays by canonical id, the forward
//! order of canonical stages, and the check that an engine's logits are finite — naming the first stage
//! that went non-finite when they are not. For bisect's local pass ([`crate::judge`]): what to inject for
//! each layer's input ([`injection`]), the sink that injects it ([`InjectingSink`]), and which injected
//! rows are the oracle's exact values ([`Known`], [`input_known`]).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use lockstep_engine::hooks::{Recorder, StageSink};
use lockstep_engine::{Stage, StageKind};
use ndarray::Array2;

use crate::compare::{CellComparison, EngineOutput, Phase};
use crate::golden::{GoldenEntry, GoldenFile};
use crate::npz::Dtype;

/// A sink that ignores everything (the timing pass).
pub struct NullSink;

impl StageSink for NullSink {
    fn wants(&self, _stage: Stage) -> bool {
        false
    }
    fn on_stage(&mut self, _: Stage, _: std::ops::Range<usize>, _: usize, _: &mut [f32]) {}
}

/// Sort key that puts stages in forward order: embed, blocks in order (stage kinds in forward order),
/// output_norm, logits.
pub fn forward_rank(s: Stage) -> (usize, usize, usize) {
    let kind = StageKind::ALL
        .iter()
        .position(|k| *k == s.kind)
        .unwrap_or(usize::MAX);
    // an encoder–decoder model (Whisper): mel, the encoder stack, then the decoder
    match (s.enc, s.layer, s.kind) {
        (false, None, StageKind::Mel) => (0, 0, kind),
        (true, None, StageKind::OutputNorm) => (3, 0, kind),
        (true, None, _) => (1, 0, kind),
        (true, Some(l), _) => (2, l, kind),
        (false, None, StageKind::Embed) => (4, 0, kind),
        (false, Some(l), _) => (5, l, kind),
        (false, None, _) => (6, 0, kind),
    }
}

/// Convert a recorder's stages to `[rows, width]` arrays by canonical id.
pub fn recorded_arrays(rec: Recorder) -> Result<BTreeMap<String, Array2<f32>>> {
    let mut out = BTreeMap::new();
    for (stage, r) in rec.stages {
        let rows = r.positions.len();
        out.insert(
            stage.to_string(),
            Array2::from_shape_vec((rows, r.width), r.data)?,
        );
    }
    Ok(out)
}

/// The first stage, in forward order ([`forward_rank`]), holding a NaN or ±Inf: `(stage id, row, column,
/// value)`. Arrays whose id is not a canonical stage are looked at last, by name.
pub fn first_non_finite_stage(
    arrays: &BTreeMap<String, Array2<f32>>,
) -> Option<(String, usize, usize, f32)> {
    let mut order: Vec<(&String, &Array2<f32>)> = arrays.iter().collect();
    order.sort_by_key(|(name, _)| Stage::parse(name).map_or((7, 0, 0), forward_rank));
    order.into_iter().find_map(|(name, a)| {
        let cols = a.ncols().max(1);
        a.iter().position(|v| !v.is_finite()).map(|i| {
            (
                name.clone(),
                i / cols,
                i % cols,
                a.iter().nth(i).copied().unwrap_or(f32::NAN),
            )
        })
    })
}

/// Fail when `logits` hold a NaN or ±Inf, naming the first stage (of `stages`, recorded in the same
/// forward pass) that went non-finite: an engine must never hand out garbage logits as a result.
///
/// Errors: the logits row and token, and the first non-finite stage with its row, column and value.
pub fn check_finite_logits(
    logits: &Array2<f32>,
    stages: &BTreeMap<String, Array2<f32>>,
) -> Result<()> {
    let cols = logits.ncols().max(1);
    let Some(i) = logits.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    let first = match first_non_finite_stage(stages) {
        Some((stage, r, c, v)) => {
            format!(
                "the first stage that went non-finite is `{stage}` ({v} at row {r}, column {c})"
            )
        }
        None => "no recorded stage before them is non-finite".to_string(),
    };
    bail!(
        "the engine's logits hold {} at row {}, token {}: {first}",
        logits.iter().nth(i).copied().unwrap_or(f32::NAN),
        i / cols,
        i % cols
    )
}

/// Golden rows to inject while capturing, by stage: the prefill's `[T, D]` arrays and the
/// decode steps' `[N, D]` arrays (see [`crate::judge::capture`]).
#[derive(Clone, Debug, Default)]
pub struct Injection {
    /// Prefill stages, row `t` = position `t`.
    pub prefill: BTreeMap<Stage, ndarray::Array2<f32>>,
    /// Decode stages, row `i` = decode step `i`.
    pub decode: BTreeMap<Stage, ndarray::Array2<f32>>,
}

/// A sink that records every stage, then overwrites the stages it holds golden rows for (row `p - row0`
/// for sequence position `p`) — the engine's replace hook, used to hand each layer the reference input.
pub struct InjectingSink<'a> {
    /// What was recorded (the engine's own values, before any replacement).
    pub rec: Recorder,
    inject: &'a BTreeMap<Stage, ndarray::Array2<f32>>,
    row0: usize,
}

impl<'a> InjectingSink<'a> {
    /// Inject `inject` (by stage); golden row 0 is sequence position `row0`.
    pub fn new(inject: &'a BTreeMap<Stage, ndarray::Array2<f32>>, row0: usize) -> Self {
        InjectingSink {
            rec: Recorder::new(),
            inject,
            row0,
        }
    }
}

impl StageSink for InjectingSink<'_> {
    fn wants(&self, _stage: lockstep_engine::Stage) -> bool {
        true
    }

    fn on_stage(
        &mut self,
        stage: lockstep_engine::Stage,
        positions: std::ops::Range<usize>,
        width: usize,
        data: &mut [f32],
    ) {
        self.rec.on_stage(stage, positions.clone(), width, data);
        let Some(g) = self.inject.get(&stage) else {
            return;
        };
        if g.ncols() != width {
            return; // a shape the comparison reports; never inject a mismatched row
        }
        for (i, p) in positions.enumerate() {
            if let Some(row) = p.checked_sub(self.row0).filter(|&r| r < g.nrows()) {
                data[i * width..(i + 1) * width]
                    .iter_mut()
                    .zip(g.row(row))
                    .for_each(|(d, &v)| *d = v);
            }
        }
    }
}

/// Per (phase, injected input stage): for each row, whether the injected value is the oracle's exact f32
/// value.
pub type Known = BTreeMap<(Phase, Stage), Vec<bool>>;

/// Whether the injected input of `stage`'s layer at `row` is the oracle's exact value (`embed`: always):
/// its block input ([`Stage::layer_input`]), or for `output_norm` and `logits` the last layer output
/// injected in `phase`.
pub fn input_known(known: &Known, phase: Phase, stage: Stage, row: usize) -> bool {
    let input = match stage.layer_input() {
        Some(input) => input,
        // the final norm reads the last layer's output; the embedding reads nothing injected
        None if stage.kind == StageKind::Embed => return true,
        None => match known
            .keys()
            .filter(|(p, _)| *p == phase)
            .map(|(_, s)| *s)
            .max_by_key(|s| s.layer.map_or(0, |l| l + 1))
        {
            Some(s) => s,
            None => return false,
        },
    };
    known
        .get(&(phase, input))
        .is_some_and(|k| k.get(row) == Some(&true))
}

/// What to inject for each layer's input (`embed`, `blk.N.out`; prefill and decode), and per row whether
/// it is the oracle's exact f32 value. A stage the golden stores in f32 is injected as stored (exact). One
/// stored in f16 lost bits: where the engine's own accumulated row rounds to the stored one, the engine's
/// row is injected instead — the oracle's value, or one it cannot be told from — and counts as exact;
/// elsewhere the stored f16 row is injected and the layer is held to the cutoffs, not to bit equality.
///
/// `own` is the engine's accumulated pass and `accumulated` its comparison (which rows agree at storage
/// precision). Errors: a golden array that cannot be read.
pub fn injection(
    gf: &mut GoldenFile,
    entry: &GoldenEntry,
    own: &EngineOutput,
    accumulated: Option<&CellComparison>,
) -> Result<(Injection, Known)> {
    if entry.is_compact() {
        anyhow::bail!(
            "{}: a compact golden stores its stages at the positions of `stage_positions` only: nothing to inject",
            gf.path().display()
        );
    }
    let mut inj = Injection::default();
    let mut known = Known::new();
    let names: Vec<String> = entry.arrays.keys().cloned().collect();
    for name in names {
        let Some((stage, phase)) = injected_input(&name) else {
            continue;
        };
        let mut rows = gf.read_f32(&name)?;
        let mut exact = vec![true; rows.nrows()];
        if entry.arrays[&name].dtype != Dtype::F32 {
            let id = stage.to_string();
            let engine_rows = match phase {
                Phase::Prefill => own.prefill.get(&id),
                Phase::Decode => own.decode.get(&id),
            };
            let agree = accumulated
                .into_iter()
                .flat_map(|a| a.stages.iter())
                .find(|s| s.stage == id && s.phase == phase)
                .map(|s| s.exact_at_storage_by_position.clone())
                .unwrap_or_default();
            for (r, e) in exact.iter_mut().enumerate() {
                match engine_rows {
                    Some(mine) if agree.get(r) == Some(&true) && mine.dim() == rows.dim() => {
                        rows.row_mut(r).assign(&mine.row(r));
                    }
                    _ => *e = false,
                }
            }
        }
        known.insert((phase, stage), exact);
        match phase {
            Phase::Prefill => inj.prefill.insert(stage, rows),
            Phase::Decode => inj.decode.insert(stage, rows),
        };
    }
    Ok((inj, known))
}

/// The golden array `name` as a layer input bisect injects (`embed`, `blk.N.out`, and their `decode.`
/// rows): its stage ([`crate::golden::array_stage`]) and phase; `None` for every other array.
pub fn injected_input(name: &str) -> Option<(Stage, Phase)> {
    let (stage, decode) = crate::golden::array_stage(name)?;
    let phase = if decode {
        Phase::Decode
    } else {
        Phase::Prefill
    };
    (stage.kind == StageKind::Embed || stage.is_layer_output()).then_some((stage, phase))
}
