//! The case and its passes: one golden's token sequence run through an engine, on its own (the
//! accumulated pass, what `lockstep run` captures) or with the golden's layer inputs injected (the local
//! pass), recorded, checked for NaN / ±Inf and compared with the golden.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lockstep_engine::GgmlTarget;
use lockstep_engine::{NumericsMode, Stage, StageKind};

use crate::capture::{
    first_non_finite_stage, forward_rank, injected_input, injection, recorded_arrays,
    InjectingSink, Injection, Known,
};
use crate::compare::{compare, compare_stages, CellComparison, EngineOutput, Phase};
use crate::engine::Engine;
use crate::gate::{CellThresholds, Divergence, Failure, Verdict};
use crate::golden::{GoldenEntry, GoldenFile, StageMap};
use crate::npz::Dtype;

use super::finding::{tokens_finding, Finding};

/// Where an engine's capture first holds a NaN or ±Inf.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct NonFinite {
    stage: String,
    phase: Phase,
    /// Sequence position (prefill row, or T + decode step).
    position: usize,
    column: usize,
    value: f32,
}

impl NonFinite {
    pub(super) fn divergence(&self) -> Divergence {
        Divergence {
            stage: self.stage.clone(),
            phase: self.phase,
            position: self.position,
            cosine: f64::NAN,
            nmse: f64::INFINITY,
        }
    }

    pub(super) fn describe(&self) -> String {
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

/// What every pass over one golden shares: its token sequence, the engine's own tokenization, the stage map.
pub struct Case<'m> {
    entry: GoldenEntry,
    tokens: Vec<u32>,
    decode_tokens: Vec<u32>,
    own: Vec<u32>,
    /// The audio the engine encodes before the prompt (an audio golden, [`crate::golden::CellInput::Audio`]).
    audio: Option<Vec<f32>>,
    stage_map: Option<&'m StageMap>,
    forced_target: Option<GgmlTarget>,
}

/// One pass of the engine over the golden's sequence.
pub struct Pass {
    /// What the engine recorded.
    pub out: EngineOutput,
    /// Where it first held a NaN or ±Inf.
    pub(super) nf: Option<NonFinite>,
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
    /// Read the golden's sequence and input (its WAV, for an audio golden: checked against the manifest's
    /// sha256) and tokenize its prompt with `engine`.
    pub fn new(
        gf: &mut GoldenFile,
        engine: &mut dyn Engine,
        stage_map: Option<&'m StageMap>,
        forced_target: Option<GgmlTarget>,
    ) -> Result<Case<'m>> {
        let entry = gf.entry().clone();
        let (tokens, decode_tokens) = gf.read_sequence()?;
        let own = engine.tokenize(&entry.prompt, entry.add_special, entry.parse_special)?;
        let audio = crate::golden::read_input_audio(gf.golden_dir(), &entry)?;
        Ok(Case {
            entry,
            tokens,
            decode_tokens,
            own,
            audio,
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

    /// True when the golden stores a layer output (`blk.N.out`) to inject, at every prompt position (not a
    /// compact golden): only then is there a local pass.
    pub fn bisectable(&self) -> bool {
        self.entry.stores_layer_outputs()
    }

    /// True when some injected layer input (`embed`, `blk.N.out`) is stored in f16: its exact value then
    /// comes from the engine's own accumulated pass where that rounds to the stored row ([`injection`]).
    pub(super) fn injects_f16(&self) -> bool {
        self.entry
            .arrays
            .iter()
            .any(|(name, a)| injected_input(name).is_some() && a.dtype != Dtype::F32)
    }

    /// The ggml-cpu build this case mirrors in `mode` ([`ggml_target_for`]: a forced target, else the
    /// golden host's in ggml mode): the one place `run`, `bisect` and the passes take it from.
    ///
    /// Errors: ggml mode on a golden that records no host CPU.
    pub fn ggml_target(&self, mode: NumericsMode) -> Result<GgmlTarget> {
        ggml_target_for(&self.entry, mode, self.forced_target)
    }

    fn reset(&self, engine: &mut dyn Engine, mode: NumericsMode) -> Result<()> {
        let target = self.ggml_target(mode)?;
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
            self.audio.as_deref(),
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
    pub(super) fn local_with(
        &self,
        gf: &mut GoldenFile,
        engine: &mut dyn Engine,
        mode: NumericsMode,
        acc: &Pass,
        decode: bool,
    ) -> Result<(Pass, Known)> {
        if self.entry.is_compact() {
            bail!(
                "{}: a compact golden (its stages stored at the positions of `stage_positions` only) cannot be \
                 injected: a local pass needs every position's layer input",
                gf.path().display()
            );
        }
        let (injection, known) = injection(gf, &self.entry, &acc.out, acc.cmp.as_ref())?;
        if injection.prefill.keys().all(|k| k.kind == StageKind::Embed) {
            bail!(
                "{}: the golden stores no blk.N.out stage to inject; bisect needs a golden with the layer outputs",
                gf.path().display()
            );
        }
        self.reset(engine, mode)?;
        let mut out = capture(
            engine,
            self.own.clone(),
            self.audio.as_deref(),
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

/// The gate's verdict on an accumulated pass that went non-finite (`pass.cmp` is `None`): a `finite`
/// failure naming the first non-finite stage, which is also the verdict's first divergent stage.
pub fn non_finite_verdict(pass: &Pass, th: &CellThresholds) -> Verdict {
    let nf = pass.nf.as_ref();
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

/// The ggml-cpu build a cell mirrors: `forced` when given, else in ggml mode the one the golden's host
/// CPU selects ([`crate::golden::OracleInfo::ggml_target`]); reference mode ignores it.
///
/// Errors: ggml mode on a golden that records no host CPU.
fn ggml_target_for(
    entry: &GoldenEntry,
    mode: NumericsMode,
    forced: Option<GgmlTarget>,
) -> Result<GgmlTarget> {
    Ok(match (forced, mode) {
        (Some(t), _) => t,
        (None, NumericsMode::Ggml) => entry
            .oracle
            .ggml_target()
            .with_context(|| format!("golden {}", entry.path))?,
        (None, NumericsMode::Reference) => GgmlTarget::default(),
    })
}

/// The capture step of the pipeline: encode `audio` first when the cell has one ([`Engine::encode_audio`]:
/// its `mel`, `enc.…` and cross K/V stages are recorded with the prefill's, and its time counts in the
/// prefill's), then run `tokens` as one prefill and then `decode_tokens` one per step (teacher forcing)
/// through an engine already [`Engine::reset`], recording every stage and the logits.
///
/// With `inject`, every stage the injection holds is replaced by the golden's rows *after* the engine's
/// own value is recorded ([`InjectingSink`]), so each later layer computes from the reference input and
/// its recorded stages measure that layer's local error alone (what `lockstep bisect` compares).
///
/// Errors: whatever the engine reports.
pub fn capture(
    engine: &mut dyn Engine,
    own_tokens: Vec<u32>,
    audio: Option<&[f32]>,
    tokens: &[u32],
    decode_tokens: &[u32],
    inject: Option<&Injection>,
) -> Result<EngineOutput> {
    let empty = BTreeMap::new();
    let mut sink = InjectingSink::new(inject.map_or(&empty, |i| &i.prefill), 0);
    // an engine in another process gets the rows before the step; ours, through the sink's replace hook
    for (stage, rows) in inject.map_or(&empty, |i| &i.prefill) {
        let n = tokens.len().min(rows.nrows());
        engine.inject_next(*stage, rows.slice(ndarray::s![..n, ..]))?;
    }
    let t0 = Instant::now();
    if let Some(samples) = audio {
        engine.encode_audio(samples, &mut sink)?;
    }
    let prefill_logits = engine.forward(tokens, &mut sink)?;
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let mut prefill = recorded_arrays(sink.rec)?;
    // an encoder's output is its pooled embedding, already recorded as the stage `pooled`
    if !engine.is_encoder() {
        prefill.insert("logits".into(), prefill_logits);
    }
    let mut sink = InjectingSink::new(inject.map_or(&empty, |i| &i.decode), tokens.len());
    let mut decode_logits = Vec::new();
    let mut decode_seconds = 0.0;
    for (i, &t) in decode_tokens.iter().enumerate() {
        for (stage, rows) in inject.map_or(&empty, |i| &i.decode) {
            if i < rows.nrows() {
                engine.inject_next(*stage, rows.slice(ndarray::s![i..i + 1, ..]))?;
            }
        }
        let t0 = Instant::now();
        decode_logits.push(engine.forward(&[t], &mut sink)?);
        decode_seconds += t0.elapsed().as_secs_f64();
    }
    let mut decode = recorded_arrays(sink.rec)?;
    if !decode_logits.is_empty() {
        let views: Vec<_> = decode_logits.iter().map(|a| a.view()).collect();
        decode.insert(
            "logits".into(),
            ndarray::concatenate(ndarray::Axis(0), &views)?,
        );
    }
    let stage_order: Vec<String> = engine.stages().into_iter().map(|(s, _)| s).collect();
    Ok(EngineOutput {
        engine_notes: engine.not_compared(),
        own_tokens,
        prefill,
        decode,
        stage_order,
        prefill_seconds,
        decode_seconds,
    })
}
