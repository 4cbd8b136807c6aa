//! The engine session protocol (version [`PROTOCOL_VERSION`]): how the harness drives an external engine
//! step by step through the engine's own KV cache, as it drives ours in process.
//!
//! The harness starts the engine once per cell as a long-lived child ([`crate::process::LineChild`]: its
//! own process group, a timeout per answer, capped output, killed with its helpers on Ctrl-C) and writes
//! one JSON object per line on its stdin; the engine answers each with one JSON object per line on its
//! stdout (its logs go to stderr; nothing else may be printed on stdout). Requests ([`Request`], `op`):
//!
//! | op | fields | answer |
//! |---|---|---|
//! | `load` | `protocol` (2), `model` (a path), `format` (`gguf`: a GGUF file; `hf`: an HF checkpoint directory), `mode`, `target`, `scratch` (a directory to write dumps in) | `engine` (name@version), `protocol`, `capabilities`, optional `n_vocab`, optional `stages` (its stage names in forward order), optional `output` (`"logits"`, the default, or `"pooled"` for an encoder) |
//! | `tokenize` | `text`, `add_special`, `parse_special` | `tokens` (capability `tokenize`) |
//! | `reset` | `mode`, `target`, `n_ctx`, optional `input_rounding` | — (a new sequence: empty KV cache, position 0) |
//! | `prefill` | `tokens`, `stages` (`"all"`) | `dump`: the path of an `.npz` in the dump format for this step |
//! | `decode` | `token`, `stages` | `dump`, one row |
//! | `inject` | `stage`, `npz` (array `value`, float32 `[n, D]`) | — (capability `inject`) |
//! | `shutdown` | — | — (then the engine exits) |
//!
//! Every answer carries `"ok": true`, or `"ok": false` with `"error": "..."`. A step's dump holds the
//! step's rows only: `tokens` `[n]` (the step's token ids), `logits` `[n, V]`, each stage `[n, D]` under its
//! canonical id or under the engine's own name mapped by a stage map file ([`stage_map`]). An encoder
//! (`load` answered `"output": "pooled"`, e.g. BERT) has no logits and no decode step: its `prefill` dump
//! holds no `logits` array, and its output is the stage `pooled`, `[1, D]` (the row of the step's last
//! position). `prefill` runs
//! its tokens at the next positions (from 0 after `reset`); `decode` runs one token at the next position,
//! through the engine's KV cache. `inject` (only if `load` announced the capability `inject`) replaces the
//! stage's value in the *next* `prefill` or `decode` — row `i` at that step's `i`-th position — after the
//! engine has recorded its own value in the step's dump; injections apply to one step only. A `reset`
//! comes before the first `prefill`. The
//! capability `input_rounding` (lockstep's own) lets `reset` ask reference mode to round every matmul input
//! as llama.cpp does (the rounding probe).
//!
//! **Versions.** The harness sends `load` with `"protocol": 2` (the highest it speaks, [`PROTOCOL_VERSION`])
//! and `format`; the engine answers with the version it speaks. An answer of 2 is an engine that reads
//! `format`. An answer of 1 is a version-1 engine, which knows GGUF files only (its `load` has no `format`):
//! accepted for a GGUF model, refused with an error naming the model and the versions for an HF checkpoint
//! ([`check_version`]). Every other request is the same in both versions.
//!
//! The client is [`client::SessionEngine`] (`lockstep run --engine-serve CMD`, `lockstep bisect
//! --engine-serve CMD`); our own engine behind the protocol is [`server`] (`lockstep serve`); the numpy-only
//! Python side is `oracles/lockstep_session/`.

pub mod client;
pub mod server;
pub mod stage_map;

use serde::{Deserialize, Serialize};

/// The protocol version `load` carries: the highest this lockstep speaks.
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest version an engine may answer `load` with: version 1, GGUF models only.
pub const PROTOCOL_VERSION_MIN: u32 = 1;

/// `load`'s `format` of a GGUF file.
pub const FORMAT_GGUF: &str = "gguf";

/// `load`'s `format` of an HF checkpoint directory (config.json, `*.safetensors`, tokenizer.json).
pub const FORMAT_HF: &str = "hf";

/// The `format` of a model path: [`FORMAT_HF`] for a directory, else [`FORMAT_GGUF`].
pub fn format_of(model: &std::path::Path) -> &'static str {
    if model.is_dir() {
        FORMAT_HF
    } else {
        FORMAT_GGUF
    }
}

/// Checks the version an engine answered `load` with, for a model of `format` at `model`.
///
/// Errors: no version, or one outside [`PROTOCOL_VERSION_MIN`]..=[`PROTOCOL_VERSION`]; version 1 for a
/// format other than [`FORMAT_GGUF`] (a version-1 engine cannot know it was handed an HF directory).
pub fn check_version(answered: Option<u32>, format: &str, model: &str) -> anyhow::Result<u32> {
    match answered {
        Some(v) if v == PROTOCOL_VERSION => Ok(v),
        Some(1) if format == FORMAT_GGUF => Ok(1),
        Some(1) => anyhow::bail!(
            "the session engine speaks protocol 1, which loads GGUF files only; {model} is an HF checkpoint \
             directory (format \"{format}\"): the engine must speak protocol {PROTOCOL_VERSION} (answer `load` \
             with \"protocol\": {PROTOCOL_VERSION} and read its `format`)"
        ),
        v => anyhow::bail!(
            "the session engine answered `load` with protocol {v:?}; this lockstep speaks {PROTOCOL_VERSION_MIN} \
             (GGUF models) and {PROTOCOL_VERSION}"
        ),
    }
}

/// Capability: the engine tokenizes (`tokenize`). Without it, lockstep's own tokenizer (llama.cpp's
/// `llama_tokenize`, from the GGUF's vocabulary) gives the ids, and the report lists `tokens` as not
/// compared.
pub const CAP_TOKENIZE: &str = "tokenize";

/// Capability: the engine takes `inject` requests (so `lockstep bisect` and `run`'s first-divergent
/// verdict can inject the golden's layer inputs).
pub const CAP_INJECT: &str = "inject";

/// Capability: `reset` takes `input_rounding` (lockstep's rounding probe).
pub const CAP_INPUT_ROUNDING: &str = "input_rounding";

/// `load`'s `output` of a decoder: logits `[n, V]` per step (the default).
pub const OUTPUT_LOGITS: &str = "logits";

/// `load`'s `output` of an encoder (BERT): no logits; the pooled embedding, the stage `pooled` `[1, D]`
/// (`engine/src/models/encoder.rs`; llama.cpp's `LLAMA_POOLING_TYPE_*`, transformers' pooler input).
pub const OUTPUT_POOLED: &str = "pooled";

/// Which stages a step's dump should hold. Version 1 always asks for every stage the engine has.
pub const ALL_STAGES: &str = "all";

/// A request of the harness, one JSON object per line on the engine's stdin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Load a model; the answer names the engine and its capabilities.
    Load {
        /// [`PROTOCOL_VERSION`] (1 from a version-1 client).
        protocol: u32,
        /// The model: a GGUF file, or an HF checkpoint directory (`format`).
        model: String,
        /// [`FORMAT_GGUF`] or [`FORMAT_HF`] (version 2; absent in a version-1 request, which means GGUF).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<String>,
        /// Numerics mode of the first sequence (`reference`, `ggml`; an engine with one numerics may
        /// ignore it).
        mode: String,
        /// The ggml-cpu build to mirror in ggml mode (`avx2`, `avx512-nobf16`, `avx512`).
        target: String,
        /// A directory the engine may write its dumps in (the harness removes it).
        scratch: String,
    },
    /// Tokenize text as `llama_tokenize(text, add_special, parse_special)`.
    Tokenize {
        /// The text.
        text: String,
        /// Add BOS (and EOS where the model does).
        add_special: bool,
        /// Recognise control-token text.
        parse_special: bool,
    },
    /// Start a new sequence: empty KV cache, next position 0.
    Reset {
        /// Numerics mode.
        mode: String,
        /// ggml-cpu build to mirror.
        target: String,
        /// Most positions of the sequence.
        n_ctx: usize,
        /// Round every matmul input as llama.cpp does, in reference mode (capability `input_rounding`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        input_rounding: bool,
    },
    /// Run `tokens` at the next positions as one batch.
    Prefill {
        /// Token ids.
        tokens: Vec<u32>,
        /// [`ALL_STAGES`].
        stages: String,
    },
    /// Run one token at the next position, through the KV cache.
    Decode {
        /// Token id.
        token: u32,
        /// [`ALL_STAGES`].
        stages: String,
    },
    /// Use the rows of `npz`'s array `value` in place of `stage` in the next step (capability `inject`).
    Inject {
        /// Stage name (canonical id, or the engine's own name under a stage map).
        stage: String,
        /// An `.npz` holding `value`, float32 `[n, D]`.
        npz: String,
    },
    /// Exit.
    Shutdown,
}

impl Request {
    /// The request's `op`, for messages.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Load { .. } => "load",
            Request::Tokenize { .. } => "tokenize",
            Request::Reset { .. } => "reset",
            Request::Prefill { .. } => "prefill",
            Request::Decode { .. } => "decode",
            Request::Inject { .. } => "inject",
            Request::Shutdown => "shutdown",
        }
    }
}

/// An engine's answer. Fields a request does not answer with are absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Success.
    pub ok: bool,
    /// What went wrong (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `ok: false`: the engine cannot run this model or setting at all (a weight type or architecture
    /// it has no kernels for) — the cell fails as `engine_error` and the run goes on to the next cell,
    /// as for lockstep's own `Error::Unsupported`. A failed `load` fails that model's cells (unsupported
    /// or not) and the run goes on; so does any later `ok: false` answer, which fails its cell
    /// ([`client::StepFailed`]). An answer that breaks the protocol stops the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsupported: bool,
    /// `load`: the version the engine speaks (2, or 1 for a version-1 engine: GGUF models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// `load`: the engine's name and version, e.g. `llama.cpp@0c1e570` (the cell id's engine field). A
    /// failed `load` may carry it too, so that the cells it fails are named after the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// `load`: optional requests it takes ([`CAP_INJECT`], [`CAP_INPUT_ROUNDING`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// `load`: vocabulary size, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_vocab: Option<usize>,
    /// `load`: the engine's stage names in forward order (optional; default: canonical order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<String>,
    /// `load`: what the model outputs, [`OUTPUT_LOGITS`] (absent means that) or [`OUTPUT_POOLED`] (an
    /// encoder: dumps without `logits`, the output is the stage `pooled` `[1, D]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// `tokenize`: the ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    /// `prefill`, `decode`: the step's dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<String>,
}

impl Reply {
    /// `{"ok": true}`.
    pub fn ok() -> Reply {
        Reply {
            ok: true,
            ..Reply::default()
        }
    }

    /// `{"ok": false, "error": ...}`.
    pub fn error(e: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(e.into()),
            ..Reply::default()
        }
    }

    /// The answer to a request that failed with `e`: `{"ok": false, "error": ...}`, with
    /// `"unsupported": true` when `e` is (or is caused by) the engine's [`lockstep_engine::Error::Unsupported`].
    pub fn failure(e: &anyhow::Error) -> Reply {
        let unsupported = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<lockstep_engine::Error>(),
                Some(lockstep_engine::Error::Unsupported(_))
            )
        });
        Reply {
            unsupported,
            ..Reply::error(format!("{e:#}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_json_object_with_an_op() {
        let r = Request::Decode {
            token: 7,
            stages: ALL_STAGES.into(),
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"decode","token":7,"stages":"all"}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        assert!(s.contains(&format!("\"op\":\"{}\"", r.op())));
        assert_eq!(
            serde_json::to_string(&Request::Shutdown).unwrap(),
            r#"{"op":"shutdown"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"fly"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"decode","token":1}"#).is_err());
    }

    #[test]
    fn load_carries_the_format_and_a_version_1_answer_is_for_gguf_only() {
        let r = Request::Load {
            protocol: PROTOCOL_VERSION,
            model: "/m".into(),
            format: Some(FORMAT_HF.into()),
            mode: "reference".into(),
            target: "avx2".into(),
            scratch: "/s".into(),
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(
            s,
            r#"{"op":"load","protocol":2,"model":"/m","format":"hf","mode":"reference","target":"avx2","scratch":"/s"}"#
        );
        // a version-1 request (no format) still parses
        let v1 = r#"{"op":"load","protocol":1,"model":"/m.gguf","mode":"ggml","target":"avx2","scratch":"/s"}"#;
        assert!(matches!(
            serde_json::from_str::<Request>(v1).unwrap(),
            Request::Load {
                format: None,
                protocol: 1,
                ..
            }
        ));
        assert_eq!(check_version(Some(2), FORMAT_HF, "/m").unwrap(), 2);
        assert_eq!(check_version(Some(2), FORMAT_GGUF, "/m").unwrap(), 2);
        assert_eq!(check_version(Some(1), FORMAT_GGUF, "/m.gguf").unwrap(), 1);
        let e = check_version(Some(1), FORMAT_HF, "/ck")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("protocol 1") && e.contains("/ck") && e.contains("HF checkpoint"),
            "{e}"
        );
        for v in [None, Some(0), Some(3)] {
            let e = check_version(v, FORMAT_GGUF, "/m").unwrap_err().to_string();
            assert!(
                e.contains("this lockstep speaks 1 (GGUF models) and 2"),
                "{e}"
            );
        }
    }

    #[test]
    fn replies_keep_only_what_they_say() {
        assert_eq!(
            serde_json::to_string(&Reply::ok()).unwrap(),
            r#"{"ok":true}"#
        );
        let e: Reply =
            serde_json::from_str(r#"{"ok":false,"error":"no model","extra":1}"#).unwrap();
        assert_eq!(e, Reply::error("no model"));
    }
}
