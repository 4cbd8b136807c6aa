//! `lockstep serve`: our own engine behind the session protocol ([`super`]), reading requests on stdin
//! and answering on stdout. What `lockstep run --engine-serve "lockstep serve"` drives; the test that
//! its verdicts and metrics equal the in-process run's is the protocol's proof.
//!
//! Each `prefill` / `decode` runs through one [`lockstep_engine::Session`] (its KV cache), records every
//! stage through the same sink the in-process capture uses ([`InjectingSink`]: the engine's own value
//! recorded, then any injected rows put in its place), and writes the step's dump into the `scratch`
//! directory `load` named.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use lockstep_engine::{GgmlTarget, Model, Numerics, NumericsMode, Session, Simd, Stage, StageKind};
use ndarray::Array2;

use super::{
    Reply, Request, CAP_INJECT, CAP_INPUT_ROUNDING, CAP_TOKENIZE, FORMAT_GGUF, PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
};
use crate::capture::{recorded_arrays, InjectingSink};
use crate::dump::Dump;
use crate::npz::{Dtype, Npz};

/// Longest request line read (a prefill of a full 128k context as JSON is ~1 MB).
const MAX_REQUEST_BYTES: u64 = 16 << 20;

/// Largest injected `value` array read.
const MAX_INJECT_BYTES: u64 = 1 << 30;

/// Largest injection file opened: [`MAX_INJECT_BYTES`] of data plus room for the archive's headers.
const MAX_INJECT_FILE_BYTES: u64 = MAX_INJECT_BYTES + (1 << 20);

/// The name `lockstep serve` reports in `load`: `lockstep@<short commit>` of the source tree it was built
/// from, else `lockstep@<crate version>`.
pub fn engine_name() -> String {
    let commit = crate::report::git(&["rev-parse", "--short=7", "HEAD"]);
    format!(
        "lockstep@{}",
        commit.unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string())
    )
}

struct Loaded {
    model: Arc<Model>,
    /// Every stage the model emits (logits aside) with its row width: what `inject` may name.
    widths: BTreeMap<Stage, usize>,
    scratch: PathBuf,
    numerics: Numerics,
    input_rounding: bool,
    session: Option<Session>,
    pending: BTreeMap<Stage, Array2<f32>>,
    steps: usize,
}

/// The server's state between requests.
struct Server {
    simd: Simd,
    loaded: Option<Loaded>,
}

/// Serve requests from `input` until `shutdown` or end of input, answering on `output` (one JSON line
/// each), with `simd`'s kernels. A request that fails is answered `{"ok": false, "error": ...}` and the
/// server goes on; a line that is not a request is answered the same way.
///
/// Errors: `output` cannot be written; `input` cannot be read, or holds a line longer than 16 MiB.
pub fn serve(input: impl BufRead, mut output: impl Write, simd: Simd) -> Result<()> {
    let mut server = Server { simd, loaded: None };
    let mut input = input;
    loop {
        let mut buf = Vec::new();
        let n = (&mut input)
            .take(MAX_REQUEST_BYTES + 1)
            .read_until(b'\n', &mut buf)
            .context("reading a request on stdin")?;
        if n == 0 {
            return Ok(());
        }
        if buf.len() as u64 > MAX_REQUEST_BYTES {
            bail!("a request line is longer than {MAX_REQUEST_BYTES} bytes");
        }
        let line = String::from_utf8_lossy(&buf);
        if line.trim().is_empty() {
            continue;
        }
        let (reply, stop) = match serde_json::from_str::<Request>(line.trim()) {
            Ok(Request::Shutdown) => (Reply::ok(), true),
            Ok(req) => {
                let load = matches!(req, Request::Load { .. });
                let reply = server.handle(req).unwrap_or_else(|e| Reply::failure(&e));
                // a refused `load` still names the engine, so the cell it fails is named after it
                let reply = if load && !reply.ok {
                    Reply {
                        engine: Some(engine_name()),
                        ..reply
                    }
                } else {
                    reply
                };
                (reply, false)
            }
            Err(e) => (Reply::error(format!("not a protocol request: {e}")), false),
        };
        let text = serde_json::to_string(&reply)?;
        writeln!(output, "{text}")
            .and_then(|()| output.flush())
            .context("writing an answer on stdout")?;
        if stop {
            return Ok(());
        }
    }
}

fn numerics(mode: &str, target: &str, simd: Simd) -> Result<Numerics> {
    Ok(Numerics {
        mode: mode.parse::<NumericsMode>().map_err(anyhow::Error::msg)?,
        target: target.parse::<GgmlTarget>().map_err(anyhow::Error::msg)?,
        simd,
    })
}

impl Server {
    fn loaded(&mut self) -> Result<&mut Loaded> {
        self.loaded.as_mut().context("no model: send `load` first")
    }

    fn handle(&mut self, req: Request) -> Result<Reply> {
        match req {
            Request::Load {
                protocol,
                model,
                format,
                mode,
                target,
                scratch,
            } => {
                if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&protocol) {
                    bail!(
                        "protocol {protocol} asked; lockstep serve speaks {PROTOCOL_VERSION_MIN} and \
                         {PROTOCOL_VERSION}"
                    );
                }
                let format = format.unwrap_or_else(|| FORMAT_GGUF.to_string());
                if format != FORMAT_GGUF && format != super::FORMAT_HF {
                    // the engine cannot run this model: the cell fails as engine_error, the run goes on
                    return Err(lockstep_engine::Error::Unsupported(format!(
                        "lockstep serve loads GGUF files and Hugging Face directories; {model} is format \
                         \"{format}\""
                    ))
                    .into());
                }
                // our engine reads either (engine/src/hf: a directory is an HF checkpoint); the format said
                // must be the one the path is
                if super::format_of(Path::new(&model)) != format {
                    bail!("{model}: `load` says format \"{format}\", but the path is not one");
                }
                let numerics = numerics(&mode, &target, self.simd)?;
                // the scratch first (cheap): dumps are only ever created new in it, never over a file
                match std::fs::metadata(&scratch) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => bail!("the scratch {scratch} is not a directory"),
                    Err(e) => bail!("the scratch directory {scratch}: {e}"),
                }
                let path = Path::new(&model);
                check_model_path(path)?;
                let m = crate::engine::LockstepEngine::load_model(path)?;
                let widths: BTreeMap<Stage, usize> = m
                    .stages()
                    .into_iter()
                    .filter(|(s, _)| s.kind != StageKind::Logits)
                    .collect();
                let stages = m
                    .stages()
                    .into_iter()
                    .filter(|(s, _)| s.kind != StageKind::Logits)
                    .map(|(s, _)| s.to_string())
                    .collect();
                let n_vocab = m.info().n_vocab;
                let output = (m.output() == lockstep_engine::models::Output::Pooled)
                    .then(|| super::OUTPUT_POOLED.to_string());
                self.loaded = Some(Loaded {
                    model: m,
                    widths,
                    scratch: PathBuf::from(scratch),
                    numerics,
                    input_rounding: false,
                    session: None,
                    pending: BTreeMap::new(),
                    steps: 0,
                });
                Ok(Reply {
                    // the version asked: a version-1 client gets a version-1 answer
                    protocol: Some(protocol),
                    engine: Some(engine_name()),
                    capabilities: vec![
                        CAP_TOKENIZE.into(),
                        CAP_INJECT.into(),
                        CAP_INPUT_ROUNDING.into(),
                    ],
                    n_vocab: Some(n_vocab),
                    stages,
                    output,
                    ..Reply::ok()
                })
            }
            Request::Tokenize {
                text,
                add_special,
                parse_special,
            } => {
                let l = self.loaded()?;
                let tokens = l
                    .model
                    .tokenizer()
                    .encode(&text, add_special, parse_special)?;
                Ok(Reply {
                    tokens: Some(tokens),
                    ..Reply::ok()
                })
            }
            Request::Reset {
                mode,
                target,
                n_ctx,
                input_rounding,
            } => {
                let simd = self.simd;
                let l = self.loaded()?;
                l.numerics = numerics(&mode, &target, simd)?;
                l.model.check_context(n_ctx)?;
                l.input_rounding = input_rounding;
                let mut session = l.model.session(n_ctx, l.numerics);
                session.set_input_rounding(input_rounding);
                l.session = Some(session);
                l.pending.clear();
                Ok(Reply::ok())
            }
            Request::Prefill { tokens, .. } => self.loaded()?.step(&tokens),
            Request::Decode { token, .. } => self.loaded()?.step(&[token]),
            Request::Inject { stage, npz } => {
                let l = self.loaded()?;
                let s = Stage::parse(&stage)
                    .with_context(|| format!("`{stage}` is not a canonical stage id"))?;
                // refused, not acknowledged and ignored: a stage this model does not emit, its output
                let Some(&width) = l.widths.get(&s) else {
                    if s.kind == StageKind::Logits {
                        bail!("`{stage}` cannot be injected: it is the model's output, no stage reads it");
                    }
                    bail!(
                        "`{stage}` cannot be injected: this model emits no such stage ({} stages, `load` \
                         listed them)",
                        l.widths.len()
                    );
                };
                let path = Path::new(&npz);
                let mut z = Npz::open_capped(path, "the injection", MAX_INJECT_FILE_BYTES)?;
                if !z.has("value") {
                    bail!("{npz}: no `value` array to inject");
                }
                let raw = z.read("value", MAX_INJECT_BYTES)?;
                if raw.dtype != Dtype::F32 || raw.shape.len() != 2 {
                    bail!(
                        "{npz}: `value` is {} {:?}, expected float32 [n, D]",
                        raw.dtype,
                        raw.shape
                    );
                }
                if raw.shape[1] != width {
                    bail!(
                        "{npz}: `value` is {:?}, but {stage} is {width} wide; nothing injected",
                        raw.shape
                    );
                }
                l.pending.insert(s, raw.to_f32()?);
                Ok(Reply::ok())
            }
            Request::Shutdown => Ok(Reply::ok()),
        }
    }
}

/// Check the `model` a `load` names before it is opened: an HF checkpoint directory holds `config.json`;
/// anything else must be a regular file ([`crate::input::check`]: never a FIFO, which would block the
/// load, nor a device).
///
/// Errors name the path and what it is.
fn check_model_path(path: &Path) -> Result<()> {
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            bail!(
                "the model {}: is a directory without config.json (a Hugging Face checkpoint directory holds \
                 config.json, *.safetensors and tokenizer.json; a GGUF model is one file)",
                path.display()
            );
        }
        return Ok(());
    }
    crate::input::check(path, "the model", u64::MAX).map(drop)
}

impl Loaded {
    /// Run one step through the session, injecting the pending rows, and write its dump.
    fn step(&mut self, tokens: &[u32]) -> Result<Reply> {
        if tokens.is_empty() {
            bail!("no tokens to run");
        }
        let session = self
            .session
            .as_mut()
            .context("no sequence: send `reset` first")?;
        let start = session.n_past();
        let pending = std::mem::take(&mut self.pending);
        for (s, rows) in &pending {
            if rows.nrows() != tokens.len() {
                bail!(
                    "the injected {s} has {} rows for a step of {} tokens",
                    rows.nrows(),
                    tokens.len()
                );
            }
        }
        let mut sink = InjectingSink::new(&pending, start);
        let v = self.model.info().n_vocab;
        let out = self.model.forward(session, tokens, Some(&mut sink))?;
        // an encoder's output is its stage `pooled`, recorded with the others: its dump has no logits
        let logits = match self.model.output() {
            lockstep_engine::models::Output::Pooled => None,
            _ => Some(Array2::from_shape_vec((tokens.len(), v), out.to_vec())?),
        };
        let mut stages = recorded_arrays(sink.rec)?;
        stages.remove(&Stage::global(StageKind::Logits).to_string());
        // a new file (O_EXCL), never one that was there: the scratch is whatever directory the client named
        let path = crate::dump::write_new_in(
            &self.scratch,
            &format!("step-{}-", self.steps),
            &Dump {
                tokens: tokens.to_vec(),
                logits,
                stages,
            },
        )?;
        self.steps += 1;
        Ok(Reply {
            dump: Some(path.display().to_string()),
            ..Reply::ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lines: &[String]) -> Vec<Reply> {
        let input = lines.join("\n") + "\n";
        let mut out = Vec::new();
        serve(input.as_bytes(), &mut out, Simd::Off).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Protocol 2: `lockstep serve` loads a Hugging Face directory said to be one (our engine reads both
    /// formats), with the same vocabulary and stages as its GGUF.
    #[test]
    fn an_hf_directory_loads_with_format_hf() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        crate::synth::write_synth("qwen3", 1, &gguf).unwrap();
        let hf = dir.path().join("m-hf");
        crate::hf::export_hf(&gguf, &hf).unwrap();
        let load = |model: &Path, format: &str| {
            format!(
                r#"{{"op":"load","protocol":2,"model":{:?},"format":"{format}","mode":"reference","target":"avx2","scratch":{:?}}}"#,
                model.display().to_string(),
                dir.path().display().to_string()
            )
        };
        let r = run(&[load(&gguf, "gguf"), load(&hf, "hf"), load(&gguf, "hf")]);
        assert!(r[0].error.is_none() && r[1].error.is_none(), "{r:?}");
        assert_eq!(r[0].n_vocab, r[1].n_vocab);
        assert_eq!(r[0].stages, r[1].stages);
        let e = r[2].error.clone().unwrap_or_default();
        assert!(e.contains("says format \"hf\""), "{r:?}");
    }

    #[test]
    fn requests_before_load_and_garbage_are_answered_with_errors() {
        let r = run(&[
            r#"{"op":"decode","token":1,"stages":"all"}"#.into(),
            "hello".into(),
            r#"{"op":"load","protocol":3,"model":"x","mode":"ggml","target":"avx2","scratch":"/tmp"}"#.into(),
            r#"{"op":"load","protocol":1,"model":"/nonexistent.gguf","mode":"ggml","target":"avx2","scratch":"/tmp"}"#.into(),
            r#"{"op":"load","protocol":2,"model":"/ck","format":"hf","mode":"ggml","target":"avx2","scratch":"/tmp"}"#.into(),
            r#"{"op":"shutdown"}"#.into(),
            r#"{"op":"decode","token":1,"stages":"all"}"#.into(),
        ]);
        assert_eq!(r.len(), 6, "nothing is answered after shutdown: {r:?}");
        let err = |i: usize| r[i].error.clone().unwrap_or_default();
        assert!(err(0).contains("send `load` first"), "{r:?}");
        assert!(err(1).contains("not a protocol request"), "{r:?}");
        assert!(err(2).contains("protocol 3"), "{r:?}");
        assert!(err(3).contains("/nonexistent.gguf"), "{r:?}");
        // an HF directory that is not one: an error naming it (our engine loads real ones)
        assert!(err(4).contains("/ck") && !r[4].unsupported, "{r:?}");
        assert_eq!(r[5], Reply::ok());
    }
}
