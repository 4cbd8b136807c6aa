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

use crate::capture::{first_non_finite_stage, forward_rank};
use crate::compare::{
    compare, compare_stages, CellComparison, EngineOutput, Phase, StageComparison,
};
use crate::engine::{Engine, LockstepEngine};
use crate::floors::{kind_of, FloorSet, Floors};
use crate::format::{fmt_cos, fmt_e3};
use crate::gate::{
    first_divergent, first_inexact, seq_position, CellThresholds, Divergence, Failure, Thresholds,
    Verdict,
};
use crate::golden::{self, GoldenEntry, GoldenFile, Manifest, StageMap};
use crate::matrix::Cell;
use crate::npz::Dtype;
use crate::run::{capture, ggml_target_for, Injection};
use lockstep_engine::Stage;

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
    /// (the `simd` axis of `lockstep run` proves it cell by cell); reference mode has no SIMD kernels.
    pub simd: lockstep_engine::Simd,
}

/// The verdict of a bisection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// The first stage whose local error is above the floor.
    Structural {
        /// Where.
        at: Divergence,
        /// Which floor it is above: `bit equality (...)`, the measured floor, or the cutoffs.
        floor: String,
        /// Local NMSE ÷ the measured floor (`None` where the floor is bit equality or a cutoff).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ratio: Option<f64>,
    },
    /// Local errors above the measured floor only where ggml mode — which rounds every matmul input to 8
    /// bits as llama.cpp does — equals the golden bit for bit: llama.cpp's own rounding, not a bug.
    OracleRounding {
        /// Each row above the floor, with the evidence.
        sites: Vec<RoundingEvidence>,
    },
    /// Local errors within the floor everywhere; the accumulated pass diverges first here.
    AccumulatedDrift {
        /// The accumulated pass's first divergent stage.
        at: Divergence,
    },
    /// The engine tokenized the prompt differently from the oracle (a tokenizer bug such as a dropped BOS,
    /// or another tokenizer): every later comparison reads other tokens, so this is the verdict and no
    /// stage is bisected.
    Tokens {
        /// Index of the first differing token (the shorter length when one sequence is a prefix).
        position: usize,
        /// The golden's token there (`None`: its sequence ended).
        golden: Option<TokenAt>,
        /// The engine's token there (`None`: its sequence ended).
        engine: Option<TokenAt>,
        /// Tokens in the golden's sequence.
        golden_len: usize,
        /// Tokens in the engine's sequence.
        engine_len: usize,
    },
    /// Neither pass diverges.
    None,
}

/// A token of a [`Finding::Tokens`]: its id and its vocabulary text, when the engine can say.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenAt {
    /// Token id.
    pub id: u32,
    /// Vocabulary text ([`Engine::token_piece`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub piece: Option<String>,
}

impl std::fmt::Display for TokenAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.piece {
            Some(p) => write!(f, "{} {p:?}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

/// The first difference between the golden's prompt tokens and the engine's tokenization of the same
/// text, as a [`Finding::Tokens`] (pieces from `engine`'s vocabulary); `None` when they are equal.
pub fn tokens_finding(golden: &[u32], mine: &[u32], engine: &dyn Engine) -> Option<Finding> {
    if golden == mine {
        return None;
    }
    let position = golden
        .iter()
        .zip(mine)
        .position(|(a, b)| a != b)
        .unwrap_or(golden.len().min(mine.len()));
    let at = |v: &[u32]| {
        v.get(position).map(|&id| TokenAt {
            id,
            piece: engine.token_piece(id),
        })
    };
    Some(Finding::Tokens {
        position,
        golden: at(golden),
        engine: at(mine),
        golden_len: golden.len(),
        engine_len: mine.len(),
    })
}

impl Finding {
    /// The tokenization difference in words: `position 0: golden 1 "<s>" vs engine 15 "Hello" (golden 12
    /// tokens, engine 11)`; `None` for other findings.
    pub fn tokens_text(&self) -> Option<String> {
        let Finding::Tokens {
            position,
            golden,
            engine,
            golden_len,
            engine_len,
        } = self
        else {
            return None;
        };
        let show = |t: &Option<TokenAt>| t.as_ref().map_or("(end)".to_string(), |t| t.to_string());
        Some(format!(
            "position {position}: golden {} vs engine {} (golden {golden_len} tokens, engine {engine_len})",
            show(golden),
            show(engine)
        ))
    }
}

/// Why a row above the floor is llama.cpp's activation rounding rather than a bug.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundingEvidence {
    /// The row (reference mode's local error there).
    pub at: Divergence,
    /// Local NMSE ÷ the measured floor.
    pub ratio: Option<f64>,
    /// The matmul input llama.cpp rounded (`blk.2.ffn_norm` for `blk.2.ffn_act`), when the golden stores it.
    pub input: Option<String>,
    /// That input row's crest factor, max|x| / rms.
    pub input_crest: Option<f64>,
    /// NMSE of rounding that row to 8 bits per 32-block (scale amax/127), as llama.cpp does before the
    /// product.
    pub input_q8_nmse: Option<f64>,
    /// The same for the median row of that input kind (all layers the golden stores, same phase).
    pub median_q8_nmse: Option<f64>,
    /// The row's local NMSE when reference mode reruns its local pass with llama.cpp's input rounding
    /// ([`Engine::set_input_rounding`]) and nothing else changed: reference mode's own code, confirming
    /// that rounding explains the row (`None`: the engine cannot round its inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounded_nmse: Option<f64>,
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
    /// True when bisect found no bug, and `lockstep bisect` exits 0: no structural finding, no tokenization
    /// difference, and — where the golden stores no layer output, so nothing could be localized
    /// ([`BisectReport::unlocalized`]) — a passing gate. Oracle-side rounding and accumulated drift are gaps
    /// the measured floors explain (numerical sensitivity, with the numbers in the report), not bugs: an
    /// unbroken engine in reference mode has such rows, and its exit status must tell it from a broken one.
    pub fn is_clean(&self) -> bool {
        match self.finding {
            Finding::Structural { .. } | Finding::Tokens { .. } => false,
            _ => self.unlocalized.is_none() || self.gate.pass,
        }
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
    let mut note = format!(
        "golden {} stores {what}: no layer output (blk.N.out) to inject, so no stage can be localized",
        entry.path
    );
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

/// Where an engine's capture first holds a NaN or ±Inf.
#[derive(Clone, Debug, PartialEq)]
struct NonFinite {
    stage: String,
    phase: Phase,
    /// Sequence position (prefill row, or T + decode step).
    position: usize,
    column: usize,
    value: f32,
}

impl NonFinite {
    fn divergence(&self) -> Divergence {
        Divergence {
            stage: self.stage.clone(),
            phase: self.phase,
            position: self.position,
            cosine: f64::NAN,
            nmse: f64::INFINITY,
        }
    }

    fn describe(&self) -> String {
        format!(
            "the engine's `{}` ({}, position {}) holds {} at column {}",
            self.stage, self.phase, self.position, self.value, self.column
        )
    }
}

/// Drop from `out` the stage `nf` names and everything after it in forward order (later stages of its
/// phase, every stage of a later phase), and the logits.
fn truncate_at(out: &mut EngineOutput, nf: &NonFinite) {
    let rank = |id: &str| Stage::parse(id).map(forward_rank);
    let cut = rank(&nf.stage);
    let keep = |id: &String| id != "logits" && cut.is_some_and(|c| rank(id).is_some_and(|r| r < c));
    match nf.phase {
        Phase::Prefill => {
            out.prefill.retain(|id, _| keep(id));
            out.decode.clear();
        }
        Phase::Decode => {
            out.prefill.remove("logits");
            out.decode.retain(|id, _| keep(id));
        }
    }
}

/// The first stage of `out` in forward order, prefill before decode, holding a NaN or ±Inf.
fn non_finite(out: &EngineOutput, n_prompt: usize) -> Option<NonFinite> {
    for (phase, arrays, row0) in [
        (Phase::Prefill, &out.prefill, 0),
        (Phase::Decode, &out.decode, n_prompt),
    ] {
        if let Some((stage, row, column, value)) = first_non_finite_stage(arrays) {
            return Some(NonFinite {
                stage,
                phase,
                position: row0 + row,
                column,
                value,
            });
        }
    }
    None
}

/// Bisect with our own engine loaded from the model's file.
pub fn bisect(opts: &BisectOptions) -> Result<BisectReport> {
    let model = crate::fetch::resolve_model(&opts.model)?;
    let mut engine = LockstepEngine::load(&model)?.with_simd(opts.simd);
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
        // what ran: reference mode's avx512 is its avx2 build (`Simd::for_mode`)
        simd: opts.simd.for_mode(opts.mode).name().into(),
        oracle: opts.oracle.clone(),
        engine: "lockstep".into(),
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
    let gate = match (&acc.cmp, &acc.nf) {
        (Some(c), _) => crate::gate::evaluate(&cell, c, &th),
        (None, nf) => non_finite_verdict(nf.as_ref(), &th),
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
    gate_finding(&mut gate, &judged.finding);
    let layers = layer_rows(acc.cmp.as_ref(), judged.local.as_ref());
    let unlocalized = (!case.bisectable()).then(|| unlocalized_note(&manifest, &entry));
    Ok(BisectReport {
        cell,
        finding: judged.finding,
        gate,
        layers,
        accumulated: acc.cmp,
        local: judged.local,
        unlocalized,
    })
}

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
                &cell.model,
                &cell.oracle,
                &cell.mode,
                &entry.path,
                &entry.sha256,
            )?
            .clone(),
    ))
}

/// What every pass over one golden shares: its token sequence, the engine's own tokenization, the stage map.
pub struct Case<'m> {
    entry: GoldenEntry,
    tokens: Vec<u32>,
    decode_tokens: Vec<u32>,
    own: Vec<u32>,
    stage_map: Option<&'m StageMap>,
    forced_target: Option<GgmlTarget>,
}

/// One pass of the engine over the golden's sequence.
pub struct Pass {
    /// What the engine recorded.
    pub out: EngineOutput,
    /// Where it first held a NaN or ±Inf.
    nf: Option<NonFinite>,
    /// Its comparison with the golden (`None` for a non-finite accumulated pass).
    pub cmp: Option<CellComparison>,
}

impl Pass {
    /// True when the engine's values stayed finite throughout.
    pub fn is_finite(&self) -> bool {
        self.nf.is_none()
    }

    /// Where the engine first produced a NaN or ±Inf, described.
    pub fn non_finite(&self) -> Option<String> {
        self.nf.as_ref().map(NonFinite::describe)
    }
}

impl<'m> Case<'m> {
    /// Read the golden's sequence and tokenize its prompt with `engine`.
    pub fn new(
        gf: &mut GoldenFile,
        engine: &mut dyn Engine,
        stage_map: Option<&'m StageMap>,
        forced_target: Option<GgmlTarget>,
    ) -> Result<Case<'m>> {
        let entry = gf.entry().clone();
        let (tokens, decode_tokens) = gf.read_sequence()?;
        let own = engine.tokenize(&entry.prompt, entry.add_special, entry.parse_special)?;
        Ok(Case {
            entry,
            tokens,
            decode_tokens,
            own,
            stage_map,
            forced_target,
        })
    }

    /// Set when `--ggml-target` names a build other than the one the golden records (its host CPU): ggml
    /// mode then mirrors other kernels, and bit equality with this golden is not to be expected. Says so,
    /// for every verdict that rests on bit equality.
    pub fn target_note(&self) -> Option<String> {
        let forced = self.forced_target?;
        let golden = self.entry.oracle.ggml_target().ok()?;
        (forced != golden).then(|| {
            format!(
                "--ggml-target {forced} differs from the golden's host build ({golden}): ggml mode mirrors \
                 other kernels than llama.cpp ran, so it is not expected to reproduce this golden bit for bit"
            )
        })
    }

    /// The engine's tokenization against the golden's tokens ([`tokens_finding`]).
    pub fn tokens_finding(&self, engine: &dyn Engine) -> Option<Finding> {
        tokens_finding(&self.tokens, &self.own, engine)
    }

    /// True when the golden stores a layer output (`blk.N.out`) to inject: only then is there a local pass.
    pub fn bisectable(&self) -> bool {
        self.entry.stores_layer_outputs()
    }

    /// True when some injected layer input (`embed`, `blk.N.out`) is stored in f16: its exact value then
    /// comes from the engine's own accumulated pass where that rounds to the stored row ([`injection`]).
    fn injects_f16(&self) -> bool {
        self.entry
            .arrays
            .iter()
            .any(|(name, a)| injected_input(name).is_some() && a.dtype != Dtype::F32)
    }

    fn reset(&self, engine: &mut dyn Engine, mode: NumericsMode) -> Result<()> {
        let target = ggml_target_for(&self.entry, mode, self.forced_target)?;
        engine.reset(mode, target, self.tokens.len() + self.decode_tokens.len())
    }

    /// The engine on its own, exactly as `lockstep run` captures a cell.
    pub fn accumulated(
        &self,
        gf: &mut GoldenFile,
        engine: &mut dyn Engine,
        mode: NumericsMode,
    ) -> Result<Pass> {
        self.reset(engine, mode)?;
        let out = capture(
            engine,
            self.own.clone(),
            &self.tokens,
            &self.decode_tokens,
            None,
        )?;
        let nf = non_finite(&out, self.tokens.len());
        let cmp = match nf {
            None => Some(compare(gf, &out, self.stage_map)?),
            Some(_) => None,
        };
        Ok(Pass { out, nf, cmp })
    }

    /// The local pass: every layer computes from the golden's input ([`injection`]); compared up to the
    /// first non-finite stage. Returns the pass and which injected rows are the oracle's exact values.
    pub fn local(
        &self,
        gf: &mut GoldenFile,
        engine: &mut dyn Engine,
        mode: NumericsMode,
        acc: &Pass,
    ) -> Result<(Pass, Known)> {
        self.local_with(gf, engine, mode, acc, true)
    }

    /// [`Case::local`], with the decode steps only when `decode` (without them the decode stages are
    /// listed as not compared: for a caller that reads prefill rows only).
    fn local_with(
        &self,
        gf: &mut GoldenFile,
        engine: &mut dyn Engine,
        mode: NumericsMode,
        acc: &Pass,
        decode: bool,
    ) -> Result<(Pass, Known)> {
        let (injection, known) = injection(gf, &self.entry, &acc.out, acc.cmp.as_ref())?;
        if injection.prefill.keys().all(|k| k == "embed") {
            bail!(
                "{}: the golden stores no blk.N.out stage to inject; bisect needs a golden with the layer outputs",
                gf.path().display()
            );
        }
        self.reset(engine, mode)?;
        let mut out = capture(
            engine,
            self.own.clone(),
            &self.tokens,
            if decode { &self.decode_tokens } else { &[] },
            Some(&injection),
        )?;
        let nf = non_finite(&out, self.tokens.len());
        if let Some(nf) = &nf {
            truncate_at(&mut out, nf);
        }
        let cmp = Some(compare_stages(gf, &out, self.stage_map)?);
        Ok((Pass { out, nf, cmp }, known))
    }
}

/// The gate's verdict on an accumulated pass that went non-finite.
fn non_finite_verdict(nf: Option<&NonFinite>, th: &CellThresholds) -> Verdict {
    Verdict {
        pass: false,
        failures: vec![Failure {
            metric: "finite".into(),
            value: 0.0,
            threshold: 1.0,
            detail: nf.map_or(
                "the engine produced a NaN or ±Inf".into(),
                NonFinite::describe,
            ),
        }],
        first_divergent: nf.map(NonFinite::divergence),
        margin_tolerance: th.margin_tolerance,
    }
}

/// Hold a cell's gate verdict to a bisect finding: a structural finding fails the cell (`structural`) and
/// is its first divergent stage; oracle-side rounding and drift leave the verdict as it is.
pub fn gate_finding(verdict: &mut Verdict, finding: &Finding) {
    if let Finding::Structural { at, floor, ratio } = finding {
        verdict.pass = false;
        verdict.failures.push(Failure {
            metric: "structural".into(),
            value: ratio.unwrap_or(f64::NAN),
            threshold: 1.0,
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
    /// first differing token if it tokenized otherwise, else the accumulated pass's first divergent stage,
    /// as drift.
    pub fn accumulated_only(
        case: &Case,
        engine: &dyn Engine,
        th: &CellThresholds,
        accumulated: Option<&CellComparison>,
    ) -> Judged {
        Judged {
            finding: case
                .tokens_finding(engine)
                .unwrap_or_else(|| drift(th, accumulated)),
            local: None,
        }
    }
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
    if !case.bisectable() {
        // no layer output to inject: the accumulated pass is all there is
        return Ok(Judged {
            finding: drift(th, acc.cmp.as_ref()),
            local: None,
        });
    }
    let (local, known) = case.local(gf, engine, mode, acc)?;
    let cmp = local
        .cmp
        .as_ref()
        .expect("the local pass is always compared");
    let hits = hits(&known, th, floors, cmp)?;
    let non_finite = |nf: &NonFinite| Finding::Structural {
        at: nf.divergence(),
        floor: format!("finite values: {}", nf.describe()),
        ratio: None,
    };
    let finding = if mode == NumericsMode::Reference && floors.is_some() {
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
fn confirm_rounding(
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
    let r_hits = hits(&r_known, th, floors, r_cmp)?;
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
enum CrossCheck {
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
fn cross_check(
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
                let g_known_row = input_known(&g_known, phase, &g.stage, row);
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

/// Per (phase, input stage id): for each row, whether the injected value is the oracle's exact f32 value.
pub type Known = BTreeMap<(Phase, String), Vec<bool>>;

/// Whether the injected input of `stage`'s layer at `row` is the oracle's exact value (`embed`: always).
pub fn input_known(known: &Known, phase: Phase, stage: &str, row: usize) -> bool {
    let input = match crate::compare::layer_of(stage) {
        Some(l) => input_of(l),
        // the final norm reads the last layer's output; the embedding reads nothing injected
        None if stage == "embed" => return true,
        None => match known
            .keys()
            .filter(|(p, _)| *p == phase)
            .map(|(_, id)| id)
            .max_by_key(|id| crate::compare::layer_of(id).map_or(0, |l| l + 1))
        {
            Some(id) => id.clone(),
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
fn injection(
    gf: &mut GoldenFile,
    entry: &GoldenEntry,
    own: &crate::compare::EngineOutput,
    accumulated: Option<&CellComparison>,
) -> Result<(Injection, Known)> {
    let mut inj = Injection::default();
    let mut known = Known::new();
    let names: Vec<String> = entry.arrays.keys().cloned().collect();
    for name in names {
        let Some((id, phase)) = injected_input(&name) else {
            continue;
        };
        let mut rows = gf.read_f32(&name)?;
        let mut exact = vec![true; rows.nrows()];
        if entry.arrays[&name].dtype != Dtype::F32 {
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
        known.insert((phase, id.clone()), exact);
        match phase {
            Phase::Prefill => inj.prefill.insert(id, rows),
            Phase::Decode => inj.decode.insert(id, rows),
        };
    }
    Ok((inj, known))
}

/// The golden array `name` as a layer input bisect injects (`embed`, `blk.N.out`, and their `decode.`
/// rows): its stage id and phase; `None` for every other array.
fn injected_input(name: &str) -> Option<(String, Phase)> {
    let (id, phase) = match name.strip_prefix("decode.") {
        Some(id) => (id, Phase::Decode),
        None => (name, Phase::Prefill),
    };
    let input = id == "embed" || crate::gate::is_out_stage(id) && id != "output_norm";
    input.then(|| (id.to_string(), phase))
}

/// The stage whose output feeds layer `layer` (its injected input): `blk.{layer-1}.out`, or `embed`.
fn input_of(layer: usize) -> String {
    match layer {
        0 => "embed".into(),
        l => format!("blk.{}.out", l - 1),
    }
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
/// - else the measured floor: local NMSE above `stage_floor_headroom × nmse_p99` of the stage kind;
/// - else (no floors for the cell) the stage cutoffs `stage_min_cosine` / `stage_max_nmse`.
fn hits(
    known: &Known,
    th: &CellThresholds,
    floors: Option<&FloorSet>,
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
                let hit = if exact_floor && input_known(known, phase, &s.stage, row) {
                    (!s.exact_at_storage_by_position.get(row).copied().unwrap_or(false)).then(|| {
                        (
                            None,
                            "bit equality at the golden's storage precision (the layer's exact input injected)"
                                .to_string(),
                        )
                    })
                } else if let (Some(k), Some(h)) = (kind, th.stage_floor_headroom) {
                    let floor = h * k.nmse_p99;
                    (nmse > floor || nmse.is_nan()).then(|| {
                        (
                            Some(nmse / floor),
                            format!(
                                "measured floor NMSE {} ({h} × p99 {} of `{}` over {} rows)",
                                fmt_e3(floor),
                                fmt_e3(k.nmse_p99),
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

/// The stage whose value a stage kind's matmuls read: the activation llama.cpp rounds to 8 bits (Q8_1,
/// Q8_K) before the product whose error the stage carries.
fn matmul_input(stage: &str) -> Option<String> {
    let l = crate::compare::layer_of(stage)?;
    let input = match kind_of(stage) {
        "q" | "k" | "v" | "q_norm" | "k_norm" | "q_rope" | "k_rope" | "attn_out" => "attn_norm",
        "attn_proj" | "attn_post_norm" | "ffn_inp" | "ffn_norm" => "attn_out",
        "ffn_gate" | "ffn_up" | "ffn_act" => "ffn_norm",
        "ffn_out" | "ffn_post_norm" | "out" => "ffn_act",
        _ => return None,
    };
    Some(format!("blk.{l}.{input}"))
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
    let Some(input) = matmul_input(&h.stage) else {
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
    let kind = kind_of(&input).to_string();
    let names: Vec<String> = gf
        .entry()
        .arrays
        .keys()
        .filter(|k| {
            k.strip_prefix(prefix)
                .is_some_and(|id| crate::compare::layer_of(id).is_some() && kind_of(id) == kind)
                && (h.phase == Phase::Decode || !k.starts_with("decode."))
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
    ev.input = Some(input);
    Ok(ev)
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

fn layer_rows(
    accumulated: Option<&CellComparison>,
    local: Option<&CellComparison>,
) -> Vec<LayerRow> {
    let mut rows: BTreeMap<usize, LayerRow> = BTreeMap::new();
    let new = |l: usize| LayerRow {
        layer: l,
        accumulated_out_nmse: None,
        local_worst: None,
        local_exact: true,
    };
    for s in accumulated.iter().flat_map(|a| a.stages.iter()) {
        if let (Some(l), Phase::Prefill) = (s.layer, s.phase) {
            let r = rows.entry(l).or_insert_with(|| new(l));
            if s.stage.ends_with(".out") {
                r.accumulated_out_nmse = Some(s.max_nmse());
            }
        }
    }
    for s in local.iter().flat_map(|a| a.stages.iter()) {
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

/// The evidence table of an oracle-side-rounding verdict (at most 12 rows).
pub fn render_rounding(sites: &[RoundingEvidence]) -> String {
    let mut out = format!(
        "{:>24}  {:>7}  {:>5}  {:>10}  {:>8}  {:>13}  {:>18}  {:>6}  {:>14}  {:>14}",
        "stage",
        "phase",
        "pos",
        "local NMSE",
        "÷ floor",
        "rounded NMSE",
        "matmul input",
        "crest",
        "input Q8 NMSE",
        "median Q8 NMSE"
    );
    let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or("-".to_string(), f);
    for s in sites.iter().take(12) {
        let _ = write!(
            out,
            "\n{:>24}  {:>7}  {:>5}  {:>10}  {:>8}  {:>13}  {:>18}  {:>6}  {:>14}  {:>14}",
            s.at.stage,
            s.at.phase.to_string(),
            s.at.position,
            fmt_e3(s.at.nmse),
            opt(s.ratio, |r| format!("{r:.1}")),
            opt(s.rounded_nmse, fmt_e3),
            s.input.as_deref().unwrap_or("-"),
            opt(s.input_crest, |c| format!("{c:.1}")),
            opt(s.input_q8_nmse, fmt_e3),
            opt(s.median_q8_nmse, fmt_e3),
        );
    }
    if sites.len() > 12 {
        let _ = write!(out, "\n... and {} more", sites.len() - 12);
    }
    out
}

/// The verdict and a table of layers around it (3 before, 3 after; all when there is no verdict), as
/// text for the terminal.
pub fn render(r: &BisectReport) -> String {
    let mut out = String::new();
    if let Some(note) = &r.unlocalized {
        let _ = writeln!(out, "cannot localize: {note}");
        if r.finding == Finding::None && !r.gate.pass {
            let failed: Vec<String> = r
                .gate
                .failures
                .iter()
                .map(|f| format!("{} = {} ({})", f.metric, f.value, f.detail))
                .collect();
            let _ = writeln!(
                out,
                "the gate fails on what the golden stores: {}",
                failed.join("; ")
            );
            return out;
        }
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
            crate::compare::layer_of(&at.stage)
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
            sites
                .first()
                .and_then(|s| crate::compare::layer_of(&s.at.stage))
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
        Finding::Tokens { .. } => {
            let _ = writeln!(
                out,
                "tokenization differs: {}; every later comparison reads other tokens, so no stage is \
                 bisected (fix the tokenizer first)",
                r.finding.tokens_text().unwrap_or_default()
            );
            None
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

    #[test]
    fn matmul_inputs_follow_the_block() {
        assert_eq!(
            matmul_input("blk.2.ffn_act").as_deref(),
            Some("blk.2.ffn_norm")
        );
        assert_eq!(
            matmul_input("blk.0.q_rope").as_deref(),
            Some("blk.0.attn_norm")
        );
        assert_eq!(matmul_input("blk.7.out").as_deref(), Some("blk.7.ffn_act"));
        assert_eq!(matmul_input("blk.7.attn_norm"), None);
        assert_eq!(matmul_input("output_norm"), None);
    }
}
