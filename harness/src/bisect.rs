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
//! The passes and the verdict ([`Finding`]: structural, oracle-side rounding, accumulated drift, tokens,
//! none) are the judging core's ([`crate::judge`]), shared with `lockstep run`; this module is the command:
//! its options, the per-layer table of both passes, and the text it prints.
//!
//! Only engines that can replace a stage can be localized: ours in process (its replace hook), or a session
//! engine that announced the `inject` capability ([`crate::protocol`], `lockstep bisect --engine-serve`);
//! another engine's stages are observed, not replaced, and its verdict says it cannot be localized.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use lockstep_engine::GgmlTarget;
use lockstep_engine::{NumericsMode, Stage};
use serde::{Deserialize, Serialize};

use crate::compare::{CellComparison, Phase};
use crate::engine::{Engine, LockstepEngine};
use crate::format::{fmt_cos, fmt_e3};
use crate::gate::Thresholds;
use crate::golden::{self, GoldenEntry, GoldenFile, Manifest};
use crate::judge::{floor_set, judge, non_finite_verdict, render_rounding, settle, Case, Finding};
use crate::matrix::Cell;

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
    /// The measured floors (`ci/floors.json`), read when the cell's thresholds ask for them.
    pub floors: PathBuf,
    /// The kernels [`bisect`] loads our engine with. Ggml mode computes the same bits with any setting
    /// (the `simd` axis of `lockstep run` proves it cell by cell); reference mode sums in one order with
    /// SIMD off and in another with any SIMD setting (`engine/src/quant/reference_fma.rs`), and its measured
    /// floors cover both (`lockstep floors` measures every setting of the matrix).
    pub simd: lockstep_engine::Simd,
}

/// One layer of the table: accumulated vs local error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerRow {
    /// Block index.
    pub layer: usize,
    /// True for a block of an encoder–decoder model's encoder stack (`enc.blk.N`, Whisper): its rows come
    /// before the decoder's, and the table names them `enc.N`. Absent (false) for every other model.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encoder: bool,
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
    /// The gate's verdict on the accumulated pass — what `lockstep run` decides for this cell.
    pub gate: crate::gate::Verdict,
    /// Per layer, accumulated vs local error.
    pub layers: Vec<LayerRow>,
    /// The accumulated pass's comparison (`None`: the engine produced a NaN or ±Inf, named by the gate's
    /// `finite` failure).
    pub accumulated: Option<CellComparison>,
    /// The local (injected) pass's comparison (`None`: a NaN or ±Inf, named by the structural finding).
    pub local: Option<CellComparison>,
    /// Set when the golden stores no layer output (`blk.N.out`) to inject, so nothing can be localized:
    /// what it stores, and which goldens of the model do store layer outputs ([`unlocalized_note`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlocalized: Option<String>,
}

impl BisectReport {
    /// True when bisect found no bug, and `lockstep bisect` exits 0: the gate passes (what `lockstep run`
    /// decides for this cell: bisect never passes a cell `run` fails — reversed logits with every stage
    /// exact, an engine that dumps no stage, a NaN in the accumulated pass alone), and no structural
    /// finding, no tokenization difference. Oracle-side rounding and accumulated drift within a passing
    /// gate are gaps the measured floors explain (numerical sensitivity, with the numbers in the report),
    /// not bugs: an unbroken engine in reference mode has such rows.
    pub fn is_clean(&self) -> bool {
        self.gate.pass
            && !matches!(
                self.finding,
                Finding::Structural { .. } | Finding::Tokens { .. }
            )
    }
}

/// Why `entry` cannot localize a divergence (it stores no layer output to inject), and where to look
/// instead: the goldens of the same model and prompt that store `blk.N.out` (with the `--oracle` that
/// selects each), or else the prompts whose golden of this oracle does.
pub fn unlocalized_note(manifest: &Manifest, entry: &GoldenEntry) -> String {
    let oracle_dir = |g: &GoldenEntry| g.path.split('/').nth(1).unwrap_or("?").to_string();
    let stored: Vec<&str> = entry.prefill_stages().collect();
    let what = if stored.is_empty() {
        "the logits only".to_string()
    } else {
        format!("{} and the logits", stored.join(", "))
    };
    let mut note = if entry.is_compact() {
        format!(
            "golden {} is compact: it stores {what} at the prompt positions of `stage_positions` only, and a local \
             pass needs every position's layer input, so no stage can be localized",
            entry.path
        )
    } else {
        format!(
            "golden {} stores {what}: no layer output (blk.N.out) to inject, so no stage can be localized",
            entry.path
        )
    };
    let same_prompt: Vec<String> = manifest
        .goldens_for_model(&entry.model_id)
        .filter(|g| {
            g.prompt_id == entry.prompt_id && g.path != entry.path && g.stores_layer_outputs()
        })
        .map(|g| format!("{} (--oracle {})", g.path, oracle_dir(g)))
        .collect();
    if !same_prompt.is_empty() {
        let _ = write!(
            note,
            "; goldens of this model and prompt that store them: {}",
            same_prompt.join(", ")
        );
    } else {
        let prompts: Vec<&str> = manifest
            .goldens_for_model(&entry.model_id)
            .filter(|g| oracle_dir(g) == oracle_dir(entry) && g.stores_layer_outputs())
            .map(|g| g.prompt_id.as_str())
            .collect();
        if prompts.is_empty() {
            let _ = write!(note, "; no golden of {} stores them", entry.model_id);
        } else {
            let _ = write!(
                note,
                "; prompts whose {} golden stores them: {}",
                oracle_dir(entry),
                prompts.join(", ")
            );
        }
    }
    note
}

/// Bisect with our own engine loaded from the model's file.
pub fn bisect(opts: &BisectOptions) -> Result<BisectReport> {
    let model = crate::fetch::resolve_model(&opts.model)?;
    let mut engine = LockstepEngine::load(&model)?.with_simd(opts.simd);
    bisect_with(opts, &model, &mut engine)
}

/// [`bisect`] through a session engine ([`crate::protocol`]): started on the model's file, held to the
/// same golden. Its local pass needs the `inject` capability: without it the verdict is
/// [`Finding::NotLocalized`] (no inject) where the gate fails or a stage differs, as `lockstep run` says.
///
/// Errors: as [`bisect`]; the engine cannot start or load the model.
pub fn bisect_serve(
    opts: &BisectOptions,
    cmd: crate::protocol::client::ServeCommand,
) -> Result<BisectReport> {
    let model = crate::fetch::resolve_model(&opts.model)?;
    let manifest = golden::load_manifest(&opts.golden_dir)?;
    let gpath = format!(
        "{}/{}/{}.npz",
        crate::registry::Registry::golden_model_of(&opts.model),
        opts.oracle,
        opts.prompt
    );
    let arch = manifest.entry(&opts.golden_dir, &gpath)?.arch.clone();
    let mut engine = crate::protocol::client::SessionEngine::start(
        cmd,
        &model,
        &arch,
        opts.mode,
        GgmlTarget::default(),
    )?;
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
    let gpath = format!(
        "{}/{}/{}.npz",
        crate::registry::Registry::golden_model_of(&opts.model),
        opts.oracle,
        opts.prompt
    );
    let entry = manifest.entry(&opts.golden_dir, &gpath)?.clone();
    golden::verify_golden(&opts.golden_dir, &entry)?;
    golden::check_model_for(
        &opts.golden_dir,
        &entry,
        &opts.model,
        &crate::hash::sha256_model(model)?,
    )?;
    let cell = Cell {
        model: opts.model.clone(),
        prompt: opts.prompt.clone(),
        quant: "-".into(),
        mode: opts.mode,
        // what ran: reference mode's avx512 is its avx2 build (`Simd::for_mode`)
        simd: opts.simd.for_mode(opts.mode).name().into(),
        oracle: opts.oracle.clone(),
        engine: engine.info().kind,
    };
    let th = thresholds.for_cell(&cell)?;
    let floors = floor_set(&opts.floors, &th, &cell, &entry)?;
    let mut gf = GoldenFile::open(&opts.golden_dir, &entry)?;
    let case = Case::new(
        &mut gf,
        engine,
        manifest.stage_map(&entry.oracle.name, &entry.arch),
        opts.ggml_target,
    )?;

    let acc = case.accumulated(&mut gf, engine, opts.mode)?;
    let gate = match &acc.cmp {
        Some(c) => crate::gate::evaluate(&cell, c, &th),
        None => non_finite_verdict(&acc, &th),
    };
    let judged = judge(
        &case,
        &mut gf,
        engine,
        opts.mode,
        &th,
        floors.as_ref(),
        &acc,
    )?;
    let mut gate = gate;
    let mut finding = judged.finding;
    // the same answer `lockstep run` gives this cell ([`crate::run`] settles it the same way)
    settle(&mut gate, &mut finding, acc.cmp.as_ref(), &th);
    let layers = layer_rows(acc.cmp.as_ref(), judged.local.as_ref());
    let unlocalized = (!case.bisectable()).then(|| unlocalized_note(&manifest, &entry));
    Ok(BisectReport {
        cell,
        finding,
        gate,
        layers,
        accumulated: acc.cmp,
        local: judged.local,
        unlocalized,
    })
}

fn layer_rows(
    accumulated: Option<&CellComparison>,
    local: Option<&CellComparison>,
) -> Vec<LayerRow> {
    // keyed (decoder stack?, block): an encoder–decoder model's encoder blocks first, in forward order
    let mut rows: BTreeMap<(bool, usize), LayerRow> = BTreeMap::new();
    let key = |s: &crate::compare::StageComparison| {
        s.layer.map(|l| (!s.id().is_some_and(|st| st.enc), l))
    };
    let new = |(dec, l): (bool, usize)| LayerRow {
        layer: l,
        encoder: !dec,
        accumulated_out_nmse: None,
        local_worst: None,
        local_exact: true,
    };
    for s in accumulated.iter().flat_map(|a| a.stages.iter()) {
        if let (Some(k), Phase::Prefill) = (key(s), s.phase) {
            let r = rows.entry(k).or_insert_with(|| new(k));
            if s.id().is_some_and(Stage::is_layer_output) {
                r.accumulated_out_nmse = Some(s.max_nmse());
            }
        }
    }
    for s in local.iter().flat_map(|a| a.stages.iter()) {
        let Some(k) = key(s) else { continue };
        let r = rows.entry(k).or_insert_with(|| new(k));
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

/// The stack and block of a canonical id (`enc.blk.N.…` → `(true, N)`, `blk.N.…` → `(false, N)`); `None` for a
/// global stage.
fn stack_layer(stage: &str) -> Option<(bool, usize)> {
    let s = Stage::parse(stage)?;
    Some((s.enc, s.layer?))
}

/// The verdict and a table of layers around it (3 before, 3 after; all when there is no verdict), as
/// text for the terminal. The first line is the verdict as report.md and the HTML run page give it for
/// the same cell (`verdict: ` + [`Finding::headline`]); the gate's failures follow when it fails.
pub fn render(r: &BisectReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "verdict: {}", r.finding.headline());
    if let Some(note) = &r.unlocalized {
        let _ = writeln!(out, "cannot localize: {note}");
    }
    let at_layer = match &r.finding {
        Finding::Structural { at, floor, ratio } => {
            let _ = writeln!(
                out,
                "structural: {} ({}, position {}) differs from the reference with the reference's own input \
                 injected — cosine {}, NMSE {}{}; above the floor: {floor}",
                at.stage,
                at.phase,
                at.position,
                fmt_cos(at.cosine),
                fmt_e3(at.nmse),
                ratio.map_or(String::new(), |r| format!(" ({r:.1} × the floor)")),
            );
            stack_layer(&at.stage)
        }
        Finding::OracleRounding { sites } => {
            let _ = writeln!(
                out,
                "oracle-side rounding: {} row(s) above the measured floor, each where ggml mode (llama.cpp's \
                 8-bit rounding of matmul inputs, reproduced) equals the golden bit for bit and where reference \
                 mode with that rounding added falls within the floor (rounded NMSE):",
                sites.len()
            );
            let _ = writeln!(out, "{}", render_rounding(sites));
            sites.first().and_then(|s| stack_layer(&s.at.stage))
        }
        Finding::AccumulatedDrift { at } => {
            let _ = writeln!(
                out,
                "accumulated drift: every stage's local error is within the floor; the accumulated pass first \
                 leaves the {} at {} ({}, position {}; cosine {}, NMSE {})",
                if r.gate.pass { "stage cutoffs" } else { "gate" },
                at.stage,
                at.phase,
                at.position,
                fmt_cos(at.cosine),
                fmt_e3(at.nmse)
            );
            stack_layer(&at.stage)
        }
        Finding::NotLocalized { at, .. } => at.as_ref().and_then(|d| stack_layer(&d.stage)),
        Finding::Tokens { .. } => {
            let _ = writeln!(
                out,
                "tokenization differs: {}; every later comparison reads other tokens, so no stage is \
                 bisected (fix the tokenizer first)",
                r.finding.tokens_text().unwrap_or_default()
            );
            None
        }
        Finding::None if r.gate.pass => {
            let _ = writeln!(out, "no divergence: neither pass leaves the floor");
            None
        }
        Finding::None => {
            let _ = writeln!(
                out,
                "no stage to place the failure at: no compared stage or logits position leaves its cutoffs"
            );
            None
        }
    };
    if !r.gate.pass {
        let failed: Vec<String> = r
            .gate
            .failures
            .iter()
            .map(|f| {
                format!(
                    "{} = {} ({})",
                    f.metric,
                    crate::gate::fmt_metric(&f.metric, f.value),
                    f.detail
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "the gate fails (as `lockstep run` fails this cell): {}",
            failed.join("; ")
        );
    }
    let _ = writeln!(
        out,
        "\n{:>5}  {:>14}  {:>26}  {:>10}  {:>12}",
        "layer", "accum out NMSE", "worst local stage", "local NMSE", "local exact"
    );
    // 3 rows before and after the verdict's block, in the table's order (an encoder's blocks, then the
    // decoder's)
    let at_row = at_layer.and_then(|(enc, l)| {
        r.layers
            .iter()
            .position(|row| row.encoder == enc && row.layer == l)
    });
    for (i, row) in r
        .layers
        .iter()
        .enumerate()
        .filter(|(i, _)| at_row.is_none_or(|a| i + 3 >= a && *i <= a + 3))
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
            if row.encoder {
                format!("enc.{}", row.layer)
            } else {
                row.layer.to_string()
            },
            row.accumulated_out_nmse.map_or("-".into(), fmt_e3),
            ws,
            wn,
            if row.local_exact { "yes" } else { "no" },
            if Some(i) == at_row { "  <--" } else { "" }
        );
    }
    out
}
