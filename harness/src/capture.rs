//! Capture: an engine's stages as arrays, in forward order, checked for non-finite values.
//!
//! What every path that runs an engine needs between the engine seam ([`crate::engine`]) and the
//! comparison: turning a [`Recorder`]'s stages into `[rows, width]` arrays by canonical id, the forward
//! order of canonical stages, and the check that an engine's logits are finite — naming the first stage
//! that went non-finite when they are not.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use lockstep_engine::hooks::{Recorder, StageSink};
use lockstep_engine::{Stage, StageKind};
use ndarray::Array2;

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
    match (s.layer, s.kind) {
        (None, StageKind::Embed) => (0, 0, kind),
        (Some(l), _) => (1, l, kind),
        (None, _) => (2, 0, kind),
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
    order.sort_by_key(|(name, _)| Stage::parse(name).map_or((3, 0, 0), forward_rank));
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
