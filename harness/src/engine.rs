//! The engine seam: the one trait through which the harness drives any engine.
//!
//! [`LockstepEngine`] is our own engine, in process. [`ExternalEngine`] is any program that writes the
//! dump format (see [`crate::dump`]) for given token ids: the harness runs it as a command and reads the
//! `.npz` it writes, so an engine written in any language can be gated without a line of Rust; it re-runs
//! every decode step from position 0 and so never exercises the engine's KV cache. An engine that keeps
//! its state speaks the session protocol instead ([`crate::protocol`]: `lockstep run --engine-serve`),
//! decoding one token at a time through its own cache.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use lockstep_engine::hooks::StageSink;
use lockstep_engine::GgmlTarget;
use lockstep_engine::{Model, Numerics, NumericsMode, Session, Simd, Stage, StageKind};
use ndarray::Array2;

use crate::capture::forward_rank;

/// Facts about a loaded engine + model, for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineInfo {
    /// The engine's name, the engine field of a cell id: `lockstep` (ours, in process), `external` (a
    /// one-shot command), or the name a session engine reports in `load` (`lockstep@f30380b`,
    /// `llama.cpp@0c1e570`; [`crate::protocol`]).
    pub kind: String,
    /// The model file.
    pub model_path: PathBuf,
    /// `general.architecture` (external engines: taken from the golden).
    pub arch: String,
    /// Vocabulary size, if known before a run.
    pub n_vocab: Option<usize>,
    /// Backend name (`scalar`, ...), or the external command.
    pub backend: String,
}

/// What the harness needs from an engine.
pub trait Engine {
    /// Describe the engine and its model.
    fn info(&self) -> EngineInfo;

    /// Tokenize text as `llama_tokenize(text, add_special, parse_special)` would.
    fn tokenize(&mut self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>>;

    /// The vocabulary text of token `id` (`llama_vocab::token_get_text`), for naming a tokenization
    /// difference; `None` when the engine cannot say (an external engine) or `id` is out of range.
    fn token_piece(&self, _id: u32) -> Option<String> {
        None
    }

    /// Canonical stage ids with row widths, in forward order (without `logits`).
    fn stages(&self) -> Vec<(String, usize)>;

    /// Start a new sequence (empty KV cache) of at most `n_ctx` positions in numerics `mode`; in ggml mode
    /// mirror `target`'s ggml-cpu kernels (the golden's host CPU).
    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, n_ctx: usize) -> Result<()>;

    /// Run `tokens` at the next positions; hand every stage to `sink`; return the logits `[T, V]` — or, for
    /// an encoder ([`Engine::is_encoder`]), its pooled embedding `[1, D]`, which is also its stage `pooled`.
    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>>;

    /// Feed an audio input before the token sequence (an encoder–decoder speech model, Whisper: a cell
    /// whose golden's input kind is `audio`, [`crate::golden::CellInput`]): `samples` are 16 kHz mono in
    /// [-1, 1]; the engine computes the log-mel spectrogram, runs its encoder and keeps what the decoder
    /// reads (the cross-attention keys and values), handing `mel`, every `enc.…` stage and each
    /// `blk.N.cross_k` / `cross_v` to `sink`. Called after [`Engine::reset`], before the first
    /// [`Engine::forward`].
    ///
    /// Errors: the engine takes no audio (the default: every engine but ours in process), the model is not
    /// a speech model, or the engine's own error.
    fn encode_audio(&mut self, _samples: &[f32], _sink: &mut dyn StageSink) -> Result<()> {
        bail!(
            "engine {} takes no audio input (a cell of a speech model needs an engine that does)",
            self.info().kind
        )
    }

    /// True when the model is an encoder (BERT): [`Engine::forward`] returns the pooled embedding, not
    /// logits, and a sequence is one forward call (no decode step). External engines: false (the dump
    /// format has logits).
    fn is_encoder(&self) -> bool {
        false
    }

    /// True when what `sink` writes into a stage is what the rest of the forward pass reads (the replace
    /// hook): only such an engine can be bisected. An external engine's stages are observed, not replaced.
    fn replaces_stages(&self) -> bool {
        false
    }

    /// Use `rows` (`[n, D]`, row `i` = the `i`-th position of the next [`Engine::forward`] call) in place
    /// of the engine's own `stage` during the next forward call only, after the engine has recorded its
    /// own value for the sink. The capture step calls it before each forward call of an injected pass
    /// ([`crate::judge::capture`]), alongside the sink, whose replace hook does the same for an engine in
    /// process: so the default does nothing. An engine in another process that [`Engine::replaces_stages`]
    /// sends the rows along (the session protocol's `inject`).
    ///
    /// Errors: the rows cannot be handed over (the engine's own error).
    fn inject_next(&mut self, _stage: Stage, _rows: ndarray::ArrayView2<'_, f32>) -> Result<()> {
        Ok(())
    }

    /// What the engine could not give, as `(name, reason)` rows for the report's "not compared" section,
    /// since the last [`Engine::reset`]: stage names it dumped that map to no canonical id (no stage map
    /// entry, or not a canonical id without a map), and `tokens` when it does not tokenize (lockstep's
    /// tokenizer gave the ids). Never dropped in silence.
    fn not_compared(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// From the next [`Engine::reset`] on, in reference mode, round every matmul input as llama.cpp does
    /// before the f32 dot products (the rounding probe, [`crate::probe`]). Returns false, and changes
    /// nothing, when the engine cannot (an external engine).
    fn set_input_rounding(&mut self, _on: bool) -> bool {
        false
    }

    /// From the next [`Engine::reset`] on, run `simd`'s kernels. Returns the setting it replaced, or
    /// `None`, changing nothing, for an engine without a SIMD axis (an external engine). The bisector's
    /// ggml-mode cross-check uses it: ggml mode gives the same bits under every setting
    /// ([`lockstep_engine::Simd`]), so it runs the fastest one the CPU has.
    fn set_simd(&mut self, _simd: Simd) -> Option<Simd> {
        None
    }
}

/// Our own engine, in process.
pub struct LockstepEngine {
    model: Arc<Model>,
    path: PathBuf,
    simd: Simd,
    input_rounding: bool,
    session: Option<Session>,
}

impl LockstepEngine {
    /// Load a GGUF file.
    pub fn load(path: &Path) -> Result<LockstepEngine> {
        Ok(LockstepEngine::shared(
            LockstepEngine::load_model(path)?,
            path.to_path_buf(),
        ))
    }

    /// Load a GGUF file's model for [`LockstepEngine::shared`] engines. Errors name the file.
    pub fn load_model(path: &Path) -> Result<Arc<Model>> {
        let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
        Ok(Arc::new(model))
    }

    /// An engine over a model already loaded and shared with other engines (`lockstep run` loads each
    /// model once for all its cells: the model is read-only, each engine keeps its own sessions).
    pub fn shared(model: Arc<Model>, path: PathBuf) -> LockstepEngine {
        LockstepEngine {
            model,
            path,
            simd: Simd::Off,
            input_rounding: false,
            session: None,
        }
    }

    /// Use `simd`'s kernels in every session from the next [`Engine::reset`] on (default
    /// [`Simd::Off`]).
    pub fn with_simd(mut self, simd: Simd) -> LockstepEngine {
        self.simd = simd;
        self
    }

    /// Wrap an already loaded model (tests build synthetic ones in memory).
    pub fn from_model(model: Model, path: PathBuf) -> LockstepEngine {
        LockstepEngine::shared(Arc::new(model), path)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }
}

impl Engine for LockstepEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: "lockstep".into(),
            model_path: self.path.clone(),
            arch: self.model.info().arch.clone(),
            n_vocab: Some(self.model.info().n_vocab),
            backend: lockstep_engine::backend::Backend::name(
                &lockstep_engine::backend::CpuBackend::new(self.simd),
            )
            .into(),
        }
    }

    fn tokenize(&mut self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        Ok(self
            .model
            .tokenizer()
            .encode(text, add_special, parse_special)?)
    }

    fn token_piece(&self, id: u32) -> Option<String> {
        self.model.tokenizer().token_text(id).map(str::to_string)
    }

    fn stages(&self) -> Vec<(String, usize)> {
        self.model
            .stages()
            .into_iter()
            .filter(|(s, _)| s.kind != StageKind::Logits)
            .map(|(s, w)| (s.to_string(), w))
            .collect()
    }

    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, n_ctx: usize) -> Result<()> {
        self.model.check_context(n_ctx)?;
        let numerics = Numerics {
            mode,
            target,
            simd: self.simd,
        };
        let mut session = self.model.session(n_ctx, numerics);
        session.set_input_rounding(self.input_rounding);
        self.session = Some(session);
        Ok(())
    }

    fn set_input_rounding(&mut self, on: bool) -> bool {
        self.input_rounding = on;
        true
    }

    fn set_simd(&mut self, simd: Simd) -> Option<Simd> {
        Some(std::mem::replace(&mut self.simd, simd))
    }

    fn replaces_stages(&self) -> bool {
        true
    }

    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>> {
        let session = self.session.as_mut().context("forward before reset")?;
        let v = self.model.output_width();
        let out = self.model.forward(session, tokens, Some(sink))?;
        Ok(Array2::from_shape_vec((out.len() / v, v), out.to_vec())?)
    }

    fn is_encoder(&self) -> bool {
        self.model.output() == lockstep_engine::models::Output::Pooled
    }

    fn encode_audio(&mut self, samples: &[f32], sink: &mut dyn StageSink) -> Result<()> {
        let session = self.session.as_mut().context("encode_audio before reset")?;
        let cfg = self.model.mel_config().with_context(|| {
            format!(
                "{}: a `{}` model has no audio encoder",
                self.path.display(),
                self.model.info().arch
            )
        })?;
        let mel = lockstep_engine::audio::log_mel(samples, &cfg)?;
        self.model.encode_audio(session, &mel, Some(sink))?;
        Ok(())
    }
}

/// Command templates of an external engine. Each template is split on whitespace into arguments, then
/// placeholders are substituted inside each argument (no shell is involved):
///
/// - forward: `{model}` model path, `{tokens}` comma-separated token ids of the whole sequence so far,
///   `{mode}` numerics mode, `{target}` the ggml target of the golden's host (`avx2`, `avx512-nobf16`,
///   `avx512`), `{out}` the `.npz` the command must write (dump format);
/// - tokenize: `{model}`, `{prompt_file}` a file holding the prompt text (UTF-8), `{parse_special}`
///   replaced by `--parse-special` or dropped; the command prints comma-separated ids on stdout.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalCommands {
    /// Template of the command that writes a dump.
    pub forward: String,
    /// Template of the command that prints token ids.
    pub tokenize: String,
    /// Time one call may take before its process group is killed ([`crate::process::DEFAULT_TIMEOUT`]).
    pub timeout: std::time::Duration,
}

impl ExternalCommands {
    /// `lockstep dump` / `lockstep tokenize` of this very binary, as an external engine (used by tests
    /// to prove the external path gives the same verdicts). The dump runs `--simd off`, like
    /// [`crate::protocol::client::ServeCommand::lockstep_itself`]: an external engine's cell is labelled
    /// `simd-off`, and reference mode's SIMD kernels sum in another order than its scalar code, so any
    /// other setting would compare unlike with like.
    pub fn lockstep_itself(exe: &Path) -> ExternalCommands {
        let exe = exe.display();
        ExternalCommands {
            forward: format!(
                "{exe} dump --model {{model}} --tokens {{tokens}} --mode {{mode}} --ggml-target {{target}} --simd off --out {{out}}"
            ),
            tokenize: format!(
                "{exe} tokenize --model {{model}} --prompt-file {{prompt_file}} {{parse_special}}"
            ),
            timeout: crate::process::DEFAULT_TIMEOUT,
        }
    }
}

/// An engine run as a subprocess that writes the dump format.
///
/// `forward` re-runs the command over the whole sequence so far (the dump contract is "these token ids
/// from position 0") and hands the new positions' rows to the sink; stages are observed, not replaceable.
pub struct ExternalEngine {
    cmds: ExternalCommands,
    model: PathBuf,
    arch: String,
    mode: NumericsMode,
    target: GgmlTarget,
    history: Vec<u32>,
    stages: Vec<(String, usize)>,
    scratch: crate::process::ScratchGuard,
}

impl ExternalEngine {
    /// An external engine for `model` (`arch` as the golden names it).
    pub fn new(cmds: ExternalCommands, model: &Path, arch: &str) -> Result<ExternalEngine> {
        Ok(ExternalEngine {
            cmds,
            model: model.to_path_buf(),
            arch: arch.to_string(),
            mode: NumericsMode::Reference,
            target: GgmlTarget::default(),
            history: Vec::new(),
            stages: Vec::new(),
            scratch: crate::process::ScratchGuard::new("lockstep-external-")
                .context("creating a scratch directory for the external engine")?,
        })
    }

    fn command(&self, template: &str, subs: &[(&str, String)]) -> Result<Command> {
        let mut args = Vec::new();
        for word in template.split_whitespace() {
            let mut w = word.to_string();
            for (k, v) in subs {
                w = w.replace(k, v);
            }
            if !w.is_empty() {
                args.push(w);
            }
        }
        let Some((prog, rest)) = args.split_first() else {
            bail!("empty external engine command template")
        };
        let mut c = Command::new(prog);
        c.args(rest);
        Ok(c)
    }

    fn run(&self, c: Command, what: &str) -> Result<Vec<u8>> {
        let shown = format!("{c:?}");
        let out = crate::process::run_bounded(c, self.cmds.timeout, self.scratch.path(), what)?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(10).collect();
            bail!(
                "external engine ({what}) failed with {}: {shown}\n{}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(out.stdout)
    }
}

impl Engine for ExternalEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: "external".into(),
            model_path: self.model.clone(),
            arch: self.arch.clone(),
            n_vocab: None,
            backend: self.cmds.forward.clone(),
        }
    }

    fn tokenize(
        &mut self,
        text: &str,
        _add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let prompt_file = self.scratch.path().join("prompt.txt");
        std::fs::write(&prompt_file, text)
            .with_context(|| format!("writing {}", prompt_file.display()))?;
        let ps = if parse_special {
            "--parse-special".to_string()
        } else {
            String::new()
        };
        let c = self.command(
            &self.cmds.tokenize,
            &[
                ("{model}", self.model.display().to_string()),
                ("{prompt_file}", prompt_file.display().to_string()),
                ("{parse_special}", ps),
            ],
        )?;
        let stdout = self.run(c, "tokenize")?;
        let text = String::from_utf8_lossy(&stdout);
        let line = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        line.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                s.trim().parse::<u32>().with_context(|| {
                    format!("external tokenize printed {line:?}, not comma-separated ids")
                })
            })
            .collect()
    }

    fn stages(&self) -> Vec<(String, usize)> {
        self.stages.clone()
    }

    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, _n_ctx: usize) -> Result<()> {
        self.mode = mode;
        self.target = target;
        self.history.clear();
        Ok(())
    }

    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>> {
        let start = self.history.len();
        self.history.extend_from_slice(tokens);
        let out = self.scratch.path().join("dump.npz");
        let ids: Vec<String> = self.history.iter().map(u32::to_string).collect();
        let c = self.command(
            &self.cmds.forward,
            &[
                ("{model}", self.model.display().to_string()),
                ("{tokens}", ids.join(",")),
                ("{mode}", self.mode.to_string()),
                ("{target}", self.target.to_string()),
                ("{out}", out.display().to_string()),
            ],
        )?;
        self.run(c, "forward")?;
        let mut d = crate::dump::read(&out)?;
        let logits = d.logits.take().with_context(|| {
            format!(
                "{}: the dump has no logits (an encoder's): the one-shot path runs decoders; run an \
                 encoder through --engine-serve",
                out.display()
            )
        })?;
        if d.tokens != self.history {
            bail!(
                "the external engine's dump {} holds tokens {:?}, expected {:?}",
                out.display(),
                d.tokens,
                self.history
            );
        }
        let end = self.history.len();
        let mut order: Vec<(Stage, String)> = Vec::new();
        for name in d.stages.keys() {
            match Stage::parse(name) {
                Some(s) => order.push((s, name.clone())),
                None => bail!(
                    "{}: array `{name}` is not a canonical stage id",
                    out.display()
                ),
            }
        }
        order.sort_by_key(|(s, _)| forward_rank(*s));
        self.stages = order
            .iter()
            .map(|(_, n)| (n.clone(), d.stages[n].ncols()))
            .collect();
        for (stage, name) in &order {
            let arr = &d.stages[name];
            let mut rows = arr.slice(ndarray::s![start..end, ..]).to_owned();
            if sink.wants(*stage) {
                let w = rows.ncols();
                let data = rows.as_slice_mut().context("contiguous rows")?;
                sink.on_stage(*stage, start..end, w, data);
            }
        }
        Ok(logits.slice(ndarray::s![start..end, ..]).to_owned())
    }
}
