//! The harness side of the session protocol: [`SessionEngine`], an [`Engine`] that is a long-lived child
//! process speaking [`super::Request`]s, one cell per child.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use lockstep_engine::hooks::StageSink;
use lockstep_engine::{GgmlTarget, NumericsMode, Stage};
use ndarray::Array2;
use ndarray_npy::NpzWriter;

use super::stage_map::NameMap;
use super::{
    Reply, Request, ALL_STAGES, CAP_INJECT, CAP_INPUT_ROUNDING, CAP_TOKENIZE, PROTOCOL_VERSION,
};
use crate::capture::forward_rank;
use crate::compare::{NOT_IN_STAGE_MAP, TOKENS_NOT_FROM_ENGINE};
use crate::engine::{Engine, EngineInfo};
use crate::process::{LineChild, ScratchGuard};

/// Largest `n_vocab` a `load` answer may give (2^24 tokens; the largest vocabularies are ~2^18).
pub const MAX_VOCAB: usize = 1 << 24;

/// How to start a session engine: the command, split on whitespace (no shell, no placeholders: the model
/// comes in `load`), the time one answer may take, and the stage map of its names, if it dumps under its
/// own.
#[derive(Clone, Debug)]
pub struct ServeCommand {
    /// The command template, e.g. `lockstep serve` or `python3 my_engine.py`.
    pub command: String,
    /// Time one answer may take before the child's process group is killed.
    pub timeout: Duration,
    /// The engine's names → canonical ids ([`NameMap`]); `None`: it dumps under canonical ids.
    pub stage_map: Option<NameMap>,
    /// The stage map file, for the report.
    pub stage_map_file: Option<PathBuf>,
}

impl ServeCommand {
    /// `lockstep serve --simd off` of this very binary (the tests' reference external engine).
    pub fn lockstep_itself(exe: &Path) -> ServeCommand {
        ServeCommand {
            command: format!("{} serve --simd off", exe.display()),
            timeout: crate::process::DEFAULT_TIMEOUT,
            stage_map: None,
            stage_map_file: None,
        }
    }
}

/// A session engine answered `load` with `ok: false`: it cannot run this model (`unsupported`) or failed
/// to load it. `lockstep run` fails that model's cell with the engine's message, names the cell after
/// the engine, and goes on with the next cell ([`crate::run`]).
#[derive(Debug)]
pub struct LoadRefused {
    /// The engine's name as its failed `load` answer gave it (`engine`), if it gave a usable one.
    pub engine: Option<String>,
    /// The answer said `"unsupported": true`.
    pub unsupported: bool,
    /// What the engine said, with its recent stderr.
    pub message: String,
}

impl std::fmt::Display for LoadRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LoadRefused {}

/// A session engine answered a request after its `load` (`reset`, `tokenize`, `prefill`, `decode`,
/// `inject`) with `ok: false`: it failed this cell (an exception in its forward pass, a shape it did not
/// expect) but still speaks the protocol. `lockstep run` fails the cell as `engine_error` with the
/// engine's message and goes on with the next cell, which starts a new engine process; a broken answer
/// (not JSON, a timeout, the process gone, a dump outside its scratch) is not this and stops the run.
#[derive(Debug)]
pub struct StepFailed {
    /// `the session engine failed `<op>`: <its error>: <its recent stderr>`.
    pub message: String,
}

impl std::fmt::Display for StepFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StepFailed {}

/// Whether `name` can be a cell id's engine field: not blank, no `/` (the id's separator), no line break.
fn valid_engine_name(name: &str) -> bool {
    !name.trim().is_empty() && !name.contains(['/', '\n']) && name.len() <= 200
}

impl ServeCommand {
    /// A name for the engine when it gave none (a refused `load` that does not say `engine`): the file
    /// name of the command's program, or of the script an interpreter (`python3`, `node`, `sh`, ...)
    /// runs — `example_engine.py` for `python3 oracles/lockstep_session/example_engine.py`.
    pub fn fallback_name(&self) -> String {
        const INTERPRETERS: [&str; 9] = [
            "python", "python3", "node", "sh", "bash", "ruby", "perl", "java", "env",
        ];
        let base = |w: &str| {
            Path::new(w)
                .file_name()
                .map_or_else(|| w.to_string(), |f| f.to_string_lossy().into_owned())
        };
        let words: Vec<&str> = self.command.split_whitespace().collect();
        let mut name = words
            .first()
            .map_or_else(|| "session".to_string(), |w| base(w));
        let interpreted = INTERPRETERS.contains(&name.as_str())
            || name.starts_with("python3.")
            || name.ends_with("python");
        if interpreted {
            if let Some(script) = words[1..].iter().find(|w| !w.starts_with('-')) {
                name = base(script);
            }
        }
        let name: String = name
            .chars()
            .filter(|c| !c.is_control() && *c != '/')
            .collect();
        if valid_engine_name(&name) {
            name
        } else {
            "session".into()
        }
    }
}

/// An engine behind the session protocol ([`super`]): started at [`SessionEngine::start`], `load`ed,
/// then driven step by step — `reset`, `prefill`, one `decode` per teacher-forced token, `inject` before a
/// step of bisect's local pass — and shut down and killed (with its process group) when dropped.
pub struct SessionEngine {
    cmd: ServeCommand,
    child: LineChild,
    scratch: ScratchGuard,
    /// The scratch directory's canonical path: an answered dump must resolve inside it.
    scratch_real: PathBuf,
    model: PathBuf,
    arch: String,
    name: String,
    capabilities: BTreeSet<String>,
    n_vocab: Option<usize>,
    /// `load` answered `"output": "pooled"`: an encoder, whose steps' output is the stage `pooled`.
    encoder: bool,
    /// Forward order the engine announced (its own names), if any.
    order: Vec<String>,
    stages: Vec<(String, usize)>,
    unmapped: BTreeSet<String>,
    pos: usize,
    input_rounding: bool,
    pending: Vec<(Stage, Array2<f32>)>,
    steps: usize,
    /// False once lockstep's tokenizer stood in for an engine without `tokenize`.
    own_tokens: bool,
    /// The version the engine answered `load` with ([`super::check_version`]).
    version: u32,
    /// The model's vocabulary for [`Engine::token_piece`], read from the model file on first use (`None`
    /// inside when lockstep cannot read it: an architecture or tokenizer it does not know).
    pieces: std::sync::OnceLock<Option<lockstep_engine::tokenizer::Tokenizer>>,
}

impl SessionEngine {
    /// Start the engine and `load` `model` (`arch` as the golden names it) in `mode` with `target`: a GGUF
    /// file, or an HF checkpoint directory (`format` [`super::format_of`] the path).
    ///
    /// Errors: the command cannot start; `load` fails or times out; the answer's protocol is not one this
    /// lockstep speaks, or is version 1 for an HF checkpoint ([`super::check_version`]); it names no engine.
    pub fn start(
        cmd: ServeCommand,
        model: &Path,
        arch: &str,
        mode: NumericsMode,
        target: GgmlTarget,
    ) -> Result<SessionEngine> {
        let scratch = ScratchGuard::new("lockstep-session-")
            .context("creating a scratch directory for the session engine")?;
        let words: Vec<&str> = cmd.command.split_whitespace().collect();
        let Some((prog, rest)) = words.split_first() else {
            bail!("empty --engine-serve command");
        };
        let mut c = Command::new(prog);
        c.args(rest);
        let scratch_real = std::fs::canonicalize(scratch.path())
            .with_context(|| format!("the scratch directory {}", scratch.path().display()))?;
        let child = LineChild::spawn(c, scratch.path(), "serve")?;
        let mut e = SessionEngine {
            cmd,
            child,
            scratch,
            scratch_real,
            model: model.to_path_buf(),
            arch: arch.to_string(),
            name: String::new(),
            capabilities: BTreeSet::new(),
            n_vocab: None,
            encoder: false,
            order: Vec::new(),
            stages: Vec::new(),
            unmapped: BTreeSet::new(),
            pos: 0,
            input_rounding: false,
            pending: Vec::new(),
            steps: 0,
            own_tokens: true,
            version: PROTOCOL_VERSION,
            pieces: std::sync::OnceLock::new(),
        };
        let format = super::format_of(model);
        let r = e.call_raw(&Request::Load {
            protocol: PROTOCOL_VERSION,
            model: model.display().to_string(),
            format: Some(format.to_string()),
            mode: mode.to_string(),
            target: target.to_string(),
            scratch: e.scratch.path().display().to_string(),
        })?;
        if !r.ok {
            // this model's cells fail, named after the engine; the run goes on
            return Err(LoadRefused {
                engine: r.engine.filter(|n| valid_engine_name(n)),
                unsupported: r.unsupported,
                message: format!(
                    "the session engine {} `load` of {}: {}: {}",
                    if r.unsupported {
                        "cannot run this model (unsupported), it answered"
                    } else {
                        "failed"
                    },
                    model.display(),
                    r.error.as_deref().unwrap_or("(no error message)"),
                    e.child.shown()
                ),
            }
            .into());
        }
        e.version = super::check_version(r.protocol, format, &model.display().to_string())
            .map_err(|err| anyhow::anyhow!("{err:#}: {}", e.child.shown()))?;
        let name = r.engine.unwrap_or_default();
        if !valid_engine_name(&name) {
            bail!(
                "the session engine's `load` answer must name it in `engine` (e.g. \"my-engine@1.2\", no `/`), \
                 found {name:?}: {}",
                e.child.shown()
            );
        }
        e.name = name;
        e.capabilities = r.capabilities.into_iter().collect();
        if let Some(v) = r.n_vocab.filter(|v| !(1..=MAX_VOCAB).contains(v)) {
            bail!(
                "the session engine {}'s `load` answer says n_vocab {v}; a vocabulary holds 1 to {MAX_VOCAB} \
                 tokens: {}",
                e.name,
                e.child.shown()
            );
        }
        e.n_vocab = r.n_vocab;
        e.encoder = match r.output.as_deref() {
            None | Some(super::OUTPUT_LOGITS) => false,
            Some(super::OUTPUT_POOLED) => true,
            Some(o) => bail!(
                "the session engine's `load` answer says `output` {o:?}; the protocol knows \
                 \"{}\" and \"{}\": {}",
                super::OUTPUT_LOGITS,
                super::OUTPUT_POOLED,
                e.child.shown()
            ),
        };
        let mut seen = BTreeSet::new();
        if let Some(n) = r
            .stages
            .iter()
            .find(|n| n.trim().is_empty() || !seen.insert(n.as_str()))
        {
            bail!(
                "the session engine {}'s `load` answer lists the stage {n:?} {} in `stages`: {}",
                e.name,
                if n.trim().is_empty() {
                    "(an empty name)"
                } else {
                    "twice"
                },
                e.child.shown()
            );
        }
        e.order = r.stages;
        Ok(e)
    }

    /// The dump an engine answered a step with, checked before anything reads or deletes it: its canonical
    /// path (symlinks and `..` resolved) lies inside the scratch directory lockstep gave it, and it is a
    /// regular file there ([`crate::input`]: a FIFO or a device is refused, never opened). Returns the
    /// canonical path, the one to read and then remove.
    ///
    /// Errors name the engine, the path it answered and the scratch directory.
    fn dump_path(&self, answered: &str) -> Result<PathBuf> {
        let raw = Path::new(answered);
        let real = std::fs::canonicalize(raw).with_context(|| {
            format!(
                "the session engine {}'s dump {answered} of step {}",
                self.name, self.steps
            )
        })?;
        if real == self.scratch_real || !real.starts_with(&self.scratch_real) {
            bail!(
                "the session engine {} answered the dump {answered} (that is {}), which is not inside the \
                 scratch directory {} it was given; lockstep reads and removes dumps only there",
                self.name,
                real.display(),
                self.scratch_real.display()
            );
        }
        crate::input::check(
            &real,
            &format!("the session engine {}'s dump", self.name),
            crate::dump::MAX_DUMP_FILE_BYTES,
        )?;
        Ok(real)
    }

    /// The capabilities `load` announced.
    pub fn capabilities(&self) -> &BTreeSet<String> {
        &self.capabilities
    }

    /// The protocol version the engine answered `load` with (1 or 2).
    pub fn protocol_version(&self) -> u32 {
        self.version
    }

    /// Send a request, read its answer as it is (`ok: false` included).
    fn call_raw(&mut self, req: &Request) -> Result<Reply> {
        let line = serde_json::to_string(req)?;
        let op = req.op();
        let answer = self.child.request(&line, self.cmd.timeout)?;
        serde_json::from_str(&answer).with_context(|| {
            format!(
                "the session engine answered `{op}` with {:?}, not a protocol answer (one JSON object with \
                 \"ok\"; logs belong on stderr): {}",
                answer.chars().take(200).collect::<String>(),
                self.child.shown()
            )
        })
    }

    /// Send a request, read its answer; an `ok: false` answer is an error with the engine's message:
    /// [`lockstep_engine::Error::Unsupported`] when it says `unsupported`, else [`StepFailed`]. Either
    /// fails this cell only ([`crate::run`]); a broken answer (no JSON, a timeout, an exit) stays an
    /// error that stops the run.
    fn call(&mut self, req: &Request) -> Result<Reply> {
        let op = req.op();
        let r = self.call_raw(req)?;
        if !r.ok {
            let msg = format!(
                "{}{op}`: {}: {}",
                crate::gate::ENGINE_FAILED_MARK,
                r.error.as_deref().unwrap_or("(no error message)"),
                self.child.shown()
            );
            if r.unsupported {
                // the engine cannot run this model or setting: the cell fails, the run goes on
                return Err(lockstep_engine::Error::Unsupported(msg).into());
            }
            return Err(StepFailed { message: msg }.into());
        }
        Ok(r)
    }

    fn canonical(&self, name: &str) -> Option<Stage> {
        match &self.cmd.stage_map {
            Some(m) => m.to_canonical(name),
            None => Stage::parse(name),
        }
    }

    fn engine_name(&self, stage: Stage) -> Option<String> {
        match &self.cmd.stage_map {
            Some(m) => m.to_engine(stage),
            None => Some(stage.to_string()),
        }
    }

    /// Send the pending injections of the next step (`inject`, one `.npz` each).
    fn send_injections(&mut self, n: usize) -> Result<()> {
        for (stage, rows) in std::mem::take(&mut self.pending) {
            if rows.nrows() != n {
                bail!(
                    "injection of {stage}: {} rows for a step of {n} positions",
                    rows.nrows()
                );
            }
            let Some(name) = self.engine_name(stage) else {
                bail!(
                    "cannot inject {stage}: the stage map {} gives it no engine name",
                    self.cmd
                        .stage_map_file
                        .as_ref()
                        .map_or("(none)".into(), |p| p.display().to_string())
                );
            };
            let path = self
                .scratch
                .path()
                .join(format!("inject-{}-{}.npz", self.steps, stage));
            write_value(&path, &rows)?;
            self.call(&Request::Inject {
                stage: name,
                npz: path.display().to_string(),
            })?;
        }
        Ok(())
    }
}

impl SessionEngine {
    /// Hold the `load` answer to a sequence's first dump: an announced `n_vocab` is the width of the
    /// logits, and every announced stage is in the dump (the step asked for all stages). A contradiction
    /// is the engine's error, not something to compare around.
    ///
    /// Errors name the engine, the dump and the announced vs found values.
    fn check_load_answer(
        &self,
        path: &Path,
        d: &crate::dump::Dump,
        logits: Option<&Array2<f32>>,
    ) -> Result<()> {
        if let (Some(v), Some(l)) = (self.n_vocab, logits) {
            if l.ncols() != v {
                bail!(
                    "the session engine {}'s `load` answer says n_vocab {v}, but its dump {} holds logits \
                     {} wide: {}",
                    self.name,
                    path.display(),
                    l.ncols(),
                    self.child.shown()
                );
            }
        }
        let missing: Vec<&String> = self
            .order
            .iter()
            .filter(|n| !d.stages.contains_key(*n))
            .filter(|n| {
                self.canonical(n)
                    .is_none_or(|s| s.kind != lockstep_engine::StageKind::Logits)
            })
            .collect();
        if !missing.is_empty() {
            bail!(
                "the session engine {}'s `load` answer announced {} stage(s) its dump {} does not hold: {}{}: {}",
                self.name,
                missing.len(),
                path.display(),
                missing
                    .iter()
                    .take(5)
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if missing.len() > 5 { ", ..." } else { "" },
                self.child.shown()
            );
        }
        Ok(())
    }
}

impl Drop for SessionEngine {
    fn drop(&mut self) {
        // a polite goodbye, briefly; the child's group is killed right after in any case
        if let Ok(line) = serde_json::to_string(&Request::Shutdown) {
            let _ = self.child.request(&line, Duration::from_millis(200));
        }
    }
}

impl Engine for SessionEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: self.name.clone(),
            model_path: self.model.clone(),
            arch: self.arch.clone(),
            n_vocab: self.n_vocab,
            backend: self.cmd.command.clone(),
        }
    }

    fn tokenize(&mut self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        if !self.capabilities.contains(CAP_TOKENIZE) && self.model.is_dir() {
            // an HF checkpoint: its tokenizer.json through the `tokenizers` crate; `tokens` not compared
            self.own_tokens = false;
            return hf_tokenize(&self.model, text, add_special);
        }
        if !self.capabilities.contains(CAP_TOKENIZE) {
            // lockstep's tokenizer, from the GGUF's vocabulary; the report lists `tokens` as not compared
            let g = lockstep_engine::hf::open(&self.model)
                .with_context(|| format!("reading {}", self.model.display()))?;
            let t = lockstep_engine::tokenizer::Tokenizer::from_gguf(&g)
                .with_context(|| format!("the tokenizer of {}", self.model.display()))?;
            self.own_tokens = false;
            return Ok(t.encode(text, add_special, parse_special)?);
        }
        let r = self.call(&Request::Tokenize {
            text: text.to_string(),
            add_special,
            parse_special,
        })?;
        r.tokens
            .context("the session engine's `tokenize` answer holds no `tokens`")
    }

    /// The text of token `id` in the model's own vocabulary (the protocol has no request for it): the
    /// same pieces `lockstep run` names in an in-process cell's mismatches, so both reports read alike.
    fn token_piece(&self, id: u32) -> Option<String> {
        self.pieces
            .get_or_init(|| {
                let g = lockstep_engine::hf::open(&self.model).ok()?;
                lockstep_engine::tokenizer::Tokenizer::from_gguf(&g).ok()
            })
            .as_ref()?
            .token_text(id)
            .map(str::to_string)
    }

    fn stages(&self) -> Vec<(String, usize)> {
        self.stages.clone()
    }

    fn reset(&mut self, mode: NumericsMode, target: GgmlTarget, n_ctx: usize) -> Result<()> {
        self.call(&Request::Reset {
            mode: mode.to_string(),
            target: target.to_string(),
            n_ctx,
            input_rounding: self.input_rounding,
        })?;
        self.pos = 0;
        self.pending.clear();
        self.unmapped.clear();
        Ok(())
    }

    fn replaces_stages(&self) -> bool {
        self.capabilities.contains(CAP_INJECT)
    }

    fn is_encoder(&self) -> bool {
        self.encoder
    }

    fn set_input_rounding(&mut self, on: bool) -> bool {
        if !self.capabilities.contains(CAP_INPUT_ROUNDING) {
            return false;
        }
        self.input_rounding = on;
        true
    }

    fn inject_next(&mut self, stage: Stage, rows: ndarray::ArrayView2<'_, f32>) -> Result<()> {
        if self.replaces_stages() {
            self.pending.push((stage, rows.to_owned()));
        }
        Ok(())
    }

    fn not_compared(&self) -> Vec<(String, String)> {
        let tokens =
            (!self.own_tokens).then(|| ("tokens".to_string(), TOKENS_NOT_FROM_ENGINE.to_string()));
        tokens
            .into_iter()
            .chain(
                self.unmapped
                    .iter()
                    .map(|n| (n.clone(), NOT_IN_STAGE_MAP.to_string())),
            )
            .collect()
    }

    fn forward(&mut self, tokens: &[u32], sink: &mut dyn StageSink) -> Result<Array2<f32>> {
        if tokens.is_empty() {
            bail!("no tokens to run");
        }
        self.send_injections(tokens.len())?;
        let req = if self.pos > 0 && tokens.len() == 1 {
            Request::Decode {
                token: tokens[0],
                stages: ALL_STAGES.into(),
            }
        } else {
            Request::Prefill {
                tokens: tokens.to_vec(),
                stages: ALL_STAGES.into(),
            }
        };
        let r = self.call(&req)?;
        self.steps += 1;
        let answered = r
            .dump
            .context("the session engine's answer names no `dump`")?;
        let path = self.dump_path(&answered)?;
        let read = crate::dump::read(&path)
            .with_context(|| format!("the session engine's dump of step {}", self.steps));
        // inside the scratch (checked above): removed whether it reads or not
        let _ = std::fs::remove_file(&path);
        let mut d = read?;
        let logits = d.logits.take();
        if logits.is_some() == self.encoder {
            bail!(
                "the session engine's dump {} {} a `logits` array, but its `load` answer said it is {}",
                path.display(),
                if self.encoder { "holds" } else { "has no" },
                if self.encoder {
                    "an encoder (`output`: \"pooled\")"
                } else {
                    "a decoder (no `output`: \"pooled\")"
                }
            );
        }
        if self.pos == 0 {
            // before anything else is read from the dump: what `load` announced is what it holds
            self.check_load_answer(&path, &d, logits.as_ref())?;
        }
        if d.tokens != tokens {
            bail!(
                "the session engine's dump {} holds tokens {:?}, this step ran {:?}",
                path.display(),
                d.tokens,
                tokens
            );
        }
        // canonical stages, in the engine's announced order, else in canonical forward order
        let mut found: Vec<(Stage, &String)> = Vec::new();
        for name in d.stages.keys() {
            match self.canonical(name) {
                Some(s) if s.kind != lockstep_engine::StageKind::Logits => found.push((s, name)),
                _ => {
                    self.unmapped.insert(name.clone());
                }
            }
        }
        let announced: BTreeMap<&String, usize> =
            self.order.iter().enumerate().map(|(i, n)| (n, i)).collect();
        found.sort_by_key(|(s, n)| {
            (
                announced.get(n).copied().unwrap_or(usize::MAX),
                forward_rank(*s),
            )
        });
        let mut seen = BTreeSet::new();
        for (s, n) in &found {
            if !seen.insert(*s) {
                bail!(
                    "the session engine's dump {} holds two arrays for {s} (`{n}` and another)",
                    path.display()
                );
            }
        }
        if self.pos == 0 {
            self.stages = found
                .iter()
                .map(|(s, n)| (s.to_string(), d.stages[*n].ncols()))
                .collect();
        }
        let range = self.pos..self.pos + tokens.len();
        let pooled = Stage::global(lockstep_engine::StageKind::Pooled);
        for (stage, name) in &found {
            if sink.wants(*stage) {
                let mut rows = d.stages[*name].clone();
                let w = rows.ncols();
                // an encoder's pooled row belongs to the step's last position (as ours emits it)
                let at = if self.encoder && *stage == pooled {
                    range.end - 1..range.end
                } else {
                    range.clone()
                };
                let data = rows.as_slice_mut().context("contiguous rows")?;
                sink.on_stage(*stage, at, w, data);
            }
        }
        self.pos = range.end;
        match logits {
            Some(l) => Ok(l),
            None => {
                let name = found
                    .iter()
                    .find(|(s, _)| *s == pooled)
                    .map(|(_, n)| (*n).clone())
                    .with_context(|| {
                        format!(
                            "the session engine's dump {} (an encoder's) has no `pooled` stage",
                            path.display()
                        )
                    })?;
                Ok(d.stages[&name].clone())
            }
        }
    }
}

/// The ids of `text` by an HF checkpoint's `tokenizer.json` (the `tokenizers` crate, as transformers'
/// fast tokenizer encodes: `encode(text, add_special_tokens)`; control-token text is always recognised,
/// as there). For a session engine without the `tokenize` capability on an HF model, where lockstep's
/// own GGUF tokenizer has no vocabulary to read.
///
/// Errors: tokenizer.json is missing or does not load; the encoding fails (each naming the file).
pub fn hf_tokenize(dir: &Path, text: &str, add_special: bool) -> Result<Vec<u32>> {
    let path = dir.join("tokenizer.json");
    let t = tokenizers::Tokenizer::from_file(&path).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a tokenizer the tokenizers crate loads: {e}",
            path.display()
        )
    })?;
    let enc = t
        .encode(text, add_special)
        .map_err(|e| anyhow::anyhow!("{}: encoding the prompt failed: {e}", path.display()))?;
    Ok(enc.get_ids().to_vec())
}

/// The `value` array [`SessionEngine`] writes for `inject` (and `lockstep serve` reads), `[n, D]`.
pub fn write_value(path: &Path, rows: &Array2<f32>) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = NpzWriter::new(f);
    w.add_array("value", rows)
        .and_then(|()| w.finish().map(drop))
        .with_context(|| format!("writing {}", path.display()))
}
