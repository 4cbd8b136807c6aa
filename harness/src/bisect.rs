//! `lockstep bisect`: where does an engine first compute something else than the reference, and is it a
//! bug of one stage or drift accumulated over depth?
//!
//! Two passes over one golden, through the same steps as `lockstep run` (golden → capture → compare →
//! gate, [`crate::run`]):
//!
//! - the **accumulated** pass: the engine on its own, exactly as `run` captures a cell;
//! - the **local** pass: the golden's `embed` and every `blk.L.out` it stores are injected through the
//!   engine's replace hook ([`crate::run::InjectingSink`]), after the engine's own value is recorded, so
//!   layer `L` computes from the reference's input and its stages measure layer `L`'s error alone.
//!
//! The verdict ([`Finding`]), read in forward order (prefill, then decode):
//!
//! - **structural** at stage X of layer L: the first stage whose *local* error is above the cell's floor.
//!   Where the floor is bit equality (`stage_exact`, ggml mode) and the layer's injected input is stored
//!   exactly (f32), any difference at the golden's storage precision is above it; otherwise the floor is
//!   the cell's stage cutoffs (`stage_min_cosine`, `stage_max_nmse`) — the numbers the gate's marker uses.
//! - **accumulated drift**: no stage's local error is above the floor, yet the accumulated pass diverges
//!   (its first divergent stage is reported).
//! - **none**: neither pass diverges.
//!
//! Only engines with replace hooks (ours, in process) can be bisected; an external engine's stages are
//! observed, not replaceable.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use lockstep_engine::ops::GgmlTarget;
use lockstep_engine::NumericsMode;
use serde::{Deserialize, Serialize};

use crate::compare::{compare, CellComparison, Phase, StageComparison};
use crate::engine::{Engine, LockstepEngine};
use crate::format::{fmt_cos, fmt_e3};
use crate::gate::{
    first_divergent, first_inexact, seq_position, CellThresholds, Divergence, Thresholds,
};
use crate::golden::{self, GoldenEntry, GoldenFile};
use crate::matrix::Cell;
use crate::npz::Dtype;
use crate::run::{capture, ggml_target_for, Injection};

/// What to bisect.
#[derive(Clone, Debug)]
pub struct BisectOptions {
    /// The golden directory (holds `manifest.json`).
    pub golden_dir: PathBuf,
    /// The thresholds file (the cell's floors come from it).
    pub thresholds: PathBuf,
    /// Model id (registry id; the golden directory's name).
    pub model: String,
    /// Prompt id of the golden.
    pub prompt: String,
    /// Numerics mode.
    pub mode: NumericsMode,
    /// Oracle directory, e.g. `llama.cpp-f32kv`.
    pub oracle: String,
    /// Mirror this ggml-cpu build instead of the golden's recorded one.
    pub ggml_target: Option<GgmlTarget>,
}

/// The verdict of a bisection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The first stage whose local error is above the floor.
    Structural {
        /// Where.
        at: Divergence,
        /// Which floor it is above: `bit equality (...)` or the cutoffs.
        floor: String,
    },
    /// Local errors within the floor everywhere; the accumulated pass diverges first here.
    AccumulatedDrift {
        /// The accumulated pass's first divergent stage.
        at: Divergence,
    },
    /// Neither pass diverges.
    None,
}

/// One layer of the table: accumulated vs local error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerRow {
    /// Block index.
    pub layer: usize,
    /// Largest NMSE of `blk.L.out` over the prefill positions, accumulated pass (`None`: not stored).
    pub accumulated_out_nmse: Option<f64>,
    /// The layer's stage with the largest local NMSE (prefill) and that NMSE.
    pub local_worst: Option<(String, f64)>,
    /// Every stage of the layer equal to the golden at storage precision in the local pass (prefill and
    /// decode).
    pub local_exact: bool,
}

/// Everything a bisection found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BisectReport {
    /// The cell bisected.
    pub cell: Cell,
    /// The verdict.
    pub finding: Finding,
    /// Per layer, accumulated vs local error.
    pub layers: Vec<LayerRow>,
    /// The accumulated pass's comparison.
    pub accumulated: CellComparison,
    /// The local (injected) pass's comparison.
    pub local: CellComparison,
}

/// Bisect with our own engine loaded from the model's file.
pub fn bisect(opts: &BisectOptions) -> Result<BisectReport> {
    let model = crate::fetch::resolve_model(&opts.model)?;
    let mut engine = LockstepEngine::load(&model)?;
    bisect_with(opts, &model, &mut engine)
}

/// [`bisect`] with a given engine for the model file `model` (tests plug in broken engines).
pub fn bisect_with(
    opts: &BisectOptions,
    model: &Path,
    engine: &mut dyn Engine,
) -> Result<BisectReport> {
    let manifest = golden::load_manifest(&opts.golden_dir)?;
    let thresholds = Thresholds::load(&opts.thresholds)?;
    let gpath = format!("{}/{}/{}.npz", opts.model, opts.oracle, opts.prompt);
    let entry = manifest.entry(&opts.golden_dir, &gpath)?.clone();
    golden::verify_golden(&opts.golden_dir, &entry)?;
    golden::check_model(&opts.golden_dir, &entry, &crate::hash::sha256_file(model)?)?;
    let cell = Cell {
        model: opts.model.clone(),
        prompt: opts.prompt.clone(),
        quant: "-".into(),
        mode: opts.mode.to_string(),
        simd: "off".into(),
        oracle: opts.oracle.clone(),
        engine: "lockstep".into(),
    };
    let th = thresholds.for_cell(&cell)?;
    let target = ggml_target_for(&entry, opts.mode, opts.ggml_target)?;
    let mut gf = GoldenFile::open(&opts.golden_dir, &entry)?;
    let (tokens, decode_tokens) = gf.read_sequence()?;
    let n_ctx = tokens.len() + decode_tokens.len();
    let own = engine.tokenize(&entry.prompt, entry.add_special, entry.parse_special)?;
    let stage_map = manifest.stage_map(&entry.oracle.name, &entry.arch);

    engine.reset(opts.mode, target, n_ctx)?;
    let out = capture(engine, own.clone(), &tokens, &decode_tokens, None)?;
    let accumulated = compare(&mut gf, &out, stage_map)?;

    let (injection, known) = injection(&mut gf, &entry, &out, &accumulated)?;
    if injection.prefill.keys().all(|k| k == "embed") {
        bail!(
            "{}: the golden stores no blk.N.out stage to inject; bisect needs a golden with the layer outputs",
            gf.path().display()
        );
    }
    engine.reset(opts.mode, target, n_ctx)?;
    let out = capture(engine, own, &tokens, &decode_tokens, Some(&injection))?;
    let local = compare(&mut gf, &out, stage_map)?;

    let finding = classify(&known, &th, &accumulated, &local);
    let layers = layer_rows(&accumulated, &local);
    Ok(BisectReport {
        cell,
        finding,
        layers,
        accumulated,
        local,
    })
}

/// Per (phase, input stage id): for each row, whether the injected value is the oracle's exact f32 value.
type Known = BTreeMap<(Phase, String), Vec<bool>>;

/// What to inject for each layer's input (`embed`, `blk.N.out`; prefill and decode), and per row whether
/// it is the oracle's exact f32 value. A stage the golden stores in f32 is injected as stored (exact). One
/// stored in f16 lost bits: where the engine's own accumulated row rounds to the stored one, the engine's
/// row is injected instead — the oracle's value, or one it cannot be told from — and counts as exact;
/// elsewhere the stored f16 row is injected and the layer is held to the cutoffs, not to bit equality.
fn injection(
    gf: &mut GoldenFile,
    entry: &GoldenEntry,
    own: &crate::compare::EngineOutput,
    accumulated: &CellComparison,
) -> Result<(Injection, Known)> {
    let mut inj = Injection::default();
    let mut known = Known::new();
    let names: Vec<String> = entry.arrays.keys().cloned().collect();
    for name in names {
        let (id, phase) = match name.strip_prefix("decode.") {
            Some(id) => (id.to_string(), Phase::Decode),
            None => (name.clone(), Phase::Prefill),
        };
        if id != "embed" && !crate::gate::is_out_stage(&id) || id == "output_norm" {
            continue;
        }
        let mut rows = gf.read_f32(&name)?;
        let mut exact = vec![true; rows.nrows()];
        if entry.arrays[&name].dtype != Dtype::F32 {
            let engine_rows = match phase {
                Phase::Prefill => own.prefill.get(&id),
                Phase::Decode => own.decode.get(&id),
            };
            let agree = accumulated
                .stages
                .iter()
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
        known.insert((phase, id.clone()), exact);
        match phase {
            Phase::Prefill => inj.prefill.insert(id, rows),
            Phase::Decode => inj.decode.insert(id, rows),
        };
    }
    Ok((inj, known))
}

/// The stage whose output feeds layer `layer` (its injected input): `blk.{layer-1}.out`, or `embed`.
fn input_of(layer: usize) -> String {
    match layer {
        0 => "embed".into(),
        l => format!("blk.{}.out", l - 1),
    }
}

/// Apply the floors to the local pass, in forward order; fall back on the accumulated marker.
fn classify(
    known: &Known,
    th: &CellThresholds,
    accumulated: &CellComparison,
    local: &CellComparison,
) -> Finding {
    for phase in [Phase::Prefill, Phase::Decode] {
        for s in local.stages.iter().filter(|s| s.phase == phase) {
            let input_known = |row: usize| {
                s.layer.is_some_and(|l| {
                    known
                        .get(&(phase, input_of(l)))
                        .is_some_and(|k| k.get(row) == Some(&true))
                })
            };
            let hit = |row: usize| -> bool {
                if th.stage_exact && input_known(row) {
                    !s.exact_at_storage_by_position
                        .get(row)
                        .copied()
                        .unwrap_or(false)
                } else {
                    s.cosine_by_position[row] < th.stage_min_cosine
                        || th
                            .stage_max_nmse
                            .is_some_and(|m| s.nmse_by_position.get(row).is_some_and(|&n| n > m))
                }
            };
            if let Some(row) = (0..s.cosine_by_position.len()).find(|&r| hit(r)) {
                return Finding::Structural {
                    at: divergence(local, s, row),
                    floor: if th.stage_exact && input_known(row) {
                        "bit equality at the golden's storage precision (the layer's exact input injected)"
                            .into()
                    } else {
                        format!(
                            "stage cutoffs (cosine < {}, NMSE > {})",
                            th.stage_min_cosine,
                            th.stage_max_nmse.map_or("-".into(), |m| format!("{m:e}"))
                        )
                    },
                };
            }
        }
    }
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
        position: seq_position(cmp, s.phase, row),
        cosine: s.cosine_by_position[row],
        nmse: s.nmse_by_position.get(row).copied().unwrap_or(f64::NAN),
    }
}

fn layer_rows(accumulated: &CellComparison, local: &CellComparison) -> Vec<LayerRow> {
    let mut rows: BTreeMap<usize, LayerRow> = BTreeMap::new();
    let new = |l: usize| LayerRow {
        layer: l,
        accumulated_out_nmse: None,
        local_worst: None,
        local_exact: true,
    };
    for s in &accumulated.stages {
        if let (Some(l), Phase::Prefill) = (s.layer, s.phase) {
            let r = rows.entry(l).or_insert_with(|| new(l));
            if s.stage.ends_with(".out") {
                r.accumulated_out_nmse = Some(s.max_nmse());
            }
        }
    }
    for s in &local.stages {
        let Some(l) = s.layer else { continue };
        let r = rows.entry(l).or_insert_with(|| new(l));
        r.local_exact &= s.exact_at_storage();
        if s.phase == Phase::Prefill {
            let n = s.max_nmse();
            if r.local_worst.as_ref().is_none_or(|(_, w)| n > *w) {
                r.local_worst = Some((s.stage.clone(), n));
            }
        }
    }
    rows.into_values().collect()
}

/// The verdict and a table of layers around it (3 before, 3 after; all when there is no verdict), as
/// text for the terminal.
pub fn render(r: &BisectReport) -> String {
    let mut out = String::new();
    let at_layer = match &r.finding {
        Finding::Structural { at, floor } => {
            let _ = writeln!(
                out,
                "structural: {} ({}, position {}) differs from the reference with the reference's own input \
                 injected — cosine {}, NMSE {}; above the floor: {floor}",
                at.stage,
                at.phase,
                at.position,
                fmt_cos(at.cosine),
                fmt_e3(at.nmse)
            );
            crate::compare::layer_of(&at.stage)
        }
        Finding::AccumulatedDrift { at } => {
            let _ = writeln!(
                out,
                "accumulated drift: every stage's local error is within the floor; the accumulated error first \
                 exceeds the cutoffs at {} ({}, position {}; cosine {}, NMSE {})",
                at.stage,
                at.phase,
                at.position,
                fmt_cos(at.cosine),
                fmt_e3(at.nmse)
            );
            crate::compare::layer_of(&at.stage)
        }
        Finding::None => {
            let _ = writeln!(out, "no divergence: neither pass leaves the floor");
            None
        }
    };
    let _ = writeln!(
        out,
        "\n{:>5}  {:>14}  {:>26}  {:>10}  {:>12}",
        "layer", "accum out NMSE", "worst local stage", "local NMSE", "local exact"
    );
    for row in r
        .layers
        .iter()
        .filter(|row| at_layer.is_none_or(|l| row.layer + 3 >= l && row.layer <= l + 3))
    {
        let (ws, wn) = row
            .local_worst
            .as_ref()
            .map_or(("-".to_string(), "-".to_string()), |(s, n)| {
                (s.clone(), fmt_e3(*n))
            });
        let _ = writeln!(
            out,
            "{:>5}  {:>14}  {:>26}  {:>10}  {:>12}{}",
            row.layer,
            row.accumulated_out_nmse.map_or("-".into(), fmt_e3),
            ws,
            wn,
            if row.local_exact { "yes" } else { "no" },
            if Some(row.layer) == at_layer {
                "  <--"
            } else {
                ""
            }
        );
    }
    out
}
