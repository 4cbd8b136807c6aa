//! Goldens — reference activations captured from oracles — and `golden/manifest.json`.
//!
//! A golden is one compressed NumPy `.npz` per (model file, oracle, KV-cache type, prompt), at
//! `golden/<model-id>/<oracle>-<kv>kv/<prompt-id>.npz` (e.g.
//! `golden/smollm2-135m-q4_1/llama.cpp-f32kv/prose.npz`), written by `oracles/regenerate.sh`.
//! `golden/manifest.json` lists every golden with its sha256, the model's sha256, the prompt, the
//! oracle's version and settings, and every array it holds (shape, dtype and the error that storing
//! it at that dtype adds). [`verify_golden`] holds a file to its manifest entry; the readers
//! ([`GoldenFile`], [`read_array_f32`], [`read_tokens`]) check each array against it again.
//!
//! # Arrays (the contract with `oracles/`; also in `oracles/README.md`)
//!
//! `T` = prompt tokens, `N` = decode steps, `V` = vocabulary, `D` = a stage's width. Row `t` of a
//! prompt array is position `t`; row `i` of a `decode.*` array is decode step `i` (position `T + i`).
//!
//! | array | dtype | shape | meaning |
//! |---|---|---|---|
//! | `tokens` | i32 | `[T]` | the prompt's token ids as the oracle tokenized them |
//! | `<stage id>` | f16 or f32 | `[T, D]` (`[S, D]` when compact) | a prefill stage under its canonical id (`embed`, `blk.3.q_rope`, `blk.3.out`, `output_norm`, ...); Q/K after RoPE are flattened head-major to `[T, n_head * head_dim]` |
//! | `stage_positions` | i32 | `[S]` | only in a *compact* golden: the prompt positions its prefill stages are stored at (strictly increasing, in `0..T`); row `r` of every prefill stage is position `stage_positions[r]` |
//! | `logits` | f32 | `[P, V]` | full logits rows at the prompt positions `logits_positions` |
//! | `logits_positions` | i32 | `[P]` | which positions `logits` holds (always includes `T - 1`) |
//! | `logits_topk_ids` | i32 | `[T, K]` | the `K` (64) largest logits' token ids at every prompt position, descending |
//! | `logits_topk` | f32 | `[T, K]` | their values |
//! | `decode.tokens` | i32 | `[N]` | the token fed at decode step `i` (one `llama_decode` call per token): the greedy continuation — the argmax of the previous logits — of the f32-KV golden |
//! | `decode.logits` | f32 | `[N, V]` | full logits after each decode step |
//! | `decode.<stage id>` | f16 or f32 | `[N, D]` | a stage at each decode step |
//!
//! An **audio** golden (Whisper; manifest `input = {kind = "audio", path, sha256}`, [`CellInput::Audio`]) feeds
//! the engine a WAV (its path under the golden directory) before the prompt of control tokens: besides the
//! decoder's arrays above it holds `mel` (`[frames, n_mels]`), the encoder's stages `enc.…` and each block's
//! `blk.N.cross_k` / `cross_v` (`[encoder positions, D]`, computed once per input), `logits` at every prompt
//! position (`[T, V]`, no `logits_positions` nor top-k), `floor.<id>` (f32 `[1]`: that stage's float32-vs-float64
//! NMSE in the oracle) and `greedy.tokens` (the oracle's greedy transcription); see
//! [`GoldenFile::verify_contents`].
//!
//! An encoder's golden (BERT; manifest `output = "pooled"`) has no logits and no decode steps: `tokens`, its
//! prefill stages `[T, D]`, and `pooled` (f32 `[1, D]`: the pooled embedding, the model's output, one row per
//! sequence) — see [`GoldenEntry::is_encoder`].
//!
//! Which stages a golden holds differs per golden (to respect the size budget); its manifest entry
//! lists them all, and a stage missing from a golden is simply not compared.
//!
//! A **compact** golden ([`GoldenEntry::is_compact`]; a prompt longer than what every position's stages would
//! fit in the budget, e.g. one that crosses Gemma 3's sliding window of 512 positions) stores its prefill stages
//! at the positions `stage_positions` only; the comparison takes the engine's rows at those positions
//! ([`crate::compare`]). Its layer outputs cannot be injected — a local pass needs every position's layer
//! input — so it is held to its accumulated pass alone ([`GoldenEntry::stores_layer_outputs`] is false).
//!
//! # Stage map
//!
//! `stage_map.<oracle>.<arch>` maps canonical stage ids to the oracle's own names: for llama.cpp,
//! the graph node name and op (`blk.{N}.q_rope` ← `Qcur-{N}` computed by `ROPE`); `not_exposed`
//! lists canonical stages the oracle has no node for. [`StageMap::oracle_node`] does the lookup.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use lockstep_engine::GgmlTarget;
use ndarray::Array2;
use serde::{Deserialize, Serialize};

use crate::npz::{data_bytes, NpyArray, Npz, MAX_ARRAY_BYTES};

/// The manifest schema this module reads.
pub const SCHEMA_VERSION: u32 = 1;

/// File name of the manifest inside the golden directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The array of a compact golden naming the prompt positions its prefill stages are stored at
/// ([`GoldenEntry::is_compact`], [`GoldenFile::stage_positions`]).
pub const STAGE_POSITIONS: &str = "stage_positions";

/// What a cell feeds the engine besides the golden's token prompt: the manifest entry's `input` (absent for
/// a text model's golden).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CellInput {
    /// The prompt's tokens alone.
    Tokens,
    /// An audio file the engine encodes before the prompt (Whisper: a 16 kHz mono WAV → log-mel → encoder,
    /// [`crate::engine::Engine::encode_audio`]); the prompt is then the decoder's control tokens.
    Audio {
        /// Path of the WAV, relative to the golden directory.
        path: String,
        /// Its sha256 (lowercase hex).
        sha256: String,
    },
}

/// The prefix of an audio golden's per-stage float32-vs-float64 NMSE arrays (`floor.<id>`, f32 `[1]`).
pub const FLOOR_PREFIX: &str = "floor.";

/// `golden/manifest.json`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Manifest {
    /// Must equal [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    /// Oracle name → architecture → stage map.
    #[serde(default)]
    pub stage_map: BTreeMap<String, BTreeMap<String, StageMap>>,
    /// Every golden file.
    pub goldens: Vec<GoldenEntry>,
    /// Model id → llama.cpp's measured distance from transformers-f32 and from itself with an f16 KV cache,
    /// per prompt (`oracles/yardstick/record.py`); the cross-oracle rules of `ci/thresholds.toml` derive from
    /// it ([`crate::gate::yardstick`]). Empty in manifests without measurements.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cross_oracle: BTreeMap<String, CrossOracleRecord>,
}

/// One model's measured distances (`golden/manifest.json` `cross_oracle.<model id>`): how they were measured, per
/// llama.cpp CPU build, and one [`PromptRecord`] per prompt and build. Written by `oracles/yardstick/record.py`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CrossOracleRecord {
    /// The prompt file measured, relative to the checkout.
    #[serde(default)]
    pub prompts_file: String,
    /// sha256 of that file when it was measured.
    #[serde(default)]
    pub prompts_sha256: String,
    /// llama.cpp CPU build (`avx2`, `avx512`) → how its rows were measured.
    #[serde(default)]
    pub builds: BTreeMap<String, BuildRecord>,
    /// One row per prompt and build.
    pub prompts: Vec<PromptRecord>,
}

/// How one llama.cpp build's rows of a [`CrossOracleRecord`] were measured.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct BuildRecord {
    /// The command that measured them (`oracles/yardstick/measure.sh --model ID --record`).
    #[serde(default)]
    pub command: String,
    /// Date of the measurement (YYYY-MM-DD).
    #[serde(default)]
    pub measured: String,
    /// Oracle directory name → its versions and host, as its scratch goldens recorded them.
    #[serde(default)]
    pub oracles: BTreeMap<String, serde_json::Value>,
}

/// The distances measured on one prompt.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PromptRecord {
    /// The prompt id (of the record's prompt file).
    pub prompt_id: String,
    /// The llama.cpp CPU build whose goldens were measured (`avx2`, `avx512`).
    #[serde(default)]
    pub build: String,
    /// Prompt tokens.
    #[serde(default)]
    pub n_prompt_tokens: usize,
    /// Oracle directory name → sha256 of the scratch golden the distance was computed from.
    #[serde(default)]
    pub goldens_sha256: BTreeMap<String, String>,
    /// llama.cpp-f32kv (reference) against transformers-f32.
    pub cross_oracle: PromptDistance,
    /// llama.cpp-f32kv (reference) against llama.cpp-f16kv: the F16-KV floor.
    pub f16kv: PromptDistance,
    /// The roles swapped: transformers-f32 (reference) against llama.cpp-f32kv — what a ggml-mode cell (llama.cpp
    /// bit for bit) shows against a transformers golden. Absent in records made before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_oracle_tf_ref: Option<PromptDistance>,
}

/// One distance between two goldens of one prompt, in the gated metrics of a reference cell
/// (`oracles/yardstick/distance.py`, which follows `metrics.rs` and the gate).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct PromptDistance {
    /// max(KL at the last prompt position, mean KL over every full row), nats.
    pub kl: f64,
    /// KL(P_ref ‖ P_other) at the last prompt position, nats.
    #[serde(default)]
    pub kl_last: f64,
    /// Mean KL over every full logits row (last prompt position and every decode step), nats.
    #[serde(default)]
    pub kl_mean_full: f64,
    /// Every top-1 disagreement: [position, the reference's margin in logit units].
    #[serde(default)]
    pub flips: Vec<(usize, f64)>,
    /// The largest margin among `flips` (0 without flips), logit units.
    pub max_flip_margin: f64,
    /// Mean top-5 overlap over every position.
    pub top5_mean: f64,
    /// Smallest cosine of `blk.N.out` / `output_norm` at any position.
    pub min_cos_out: f64,
    /// Where `min_cos_out` is (`stage@row`).
    #[serde(default)]
    pub min_cos_at: String,
    /// Logits positions compared (prompt and decode).
    #[serde(default)]
    pub positions: usize,
    /// Full logits rows compared.
    #[serde(default)]
    pub full_rows: usize,
}

impl Manifest {
    /// The stage map of `oracle` (e.g. `"llama.cpp"`) for architecture `arch` (e.g. `"llama"`).
    pub fn stage_map(&self, oracle: &str, arch: &str) -> Option<&StageMap> {
        self.stage_map.get(oracle)?.get(arch)
    }

    /// The golden at `path` (relative to the golden directory, as [`GoldenEntry::path`] spells it).
    /// Errors name the path and the manifest of `golden_dir`.
    pub fn entry(&self, golden_dir: &Path, path: &str) -> Result<&GoldenEntry> {
        self.goldens
            .iter()
            .find(|g| g.path == path)
            .with_context(|| {
                format!(
                    "golden {path} is not in {}",
                    golden_dir.join(MANIFEST_FILE).display()
                )
            })
    }

    /// The goldens made from the model `model_id`.
    pub fn goldens_for_model<'a>(
        &'a self,
        model_id: &'a str,
    ) -> impl Iterator<Item = &'a GoldenEntry> + 'a {
        self.goldens.iter().filter(move |g| g.model_id == model_id)
    }

    /// The golden of (`model_id`, oracle name, KV-cache type, prompt id), if there is one.
    pub fn find(
        &self,
        model_id: &str,
        oracle: &str,
        kv_type: &str,
        prompt_id: &str,
    ) -> Option<&GoldenEntry> {
        self.goldens.iter().find(|g| {
            g.model_id == model_id
                && g.oracle.name == oracle
                && g.kv_type == kv_type
                && g.prompt_id == prompt_id
        })
    }
}

/// How one oracle names the canonical stages of one architecture.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct StageMap {
    /// Free-text description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    /// One row per (oracle node, canonical stage); `{N}` stands for the layer.
    pub stages: Vec<StageMapping>,
    /// Canonical stages (patterns with `{N}`) the oracle does not expose.
    #[serde(default)]
    pub not_exposed: Vec<String>,
    /// Every distinct node the oracle's graph evaluated (documentation; not used for matching).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed_nodes: Vec<serde_json::Value>,
}

/// One row of a [`StageMap`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct StageMapping {
    /// The oracle's name, e.g. `Qcur-{N}`.
    pub oracle_name: String,
    /// The op that tells nodes sharing a name apart, e.g. `ROPE` (ggml's `ggml_op_desc`).
    pub op: String,
    /// The canonical stage id, e.g. `blk.{N}.q_rope`.
    pub canonical: String,
}

/// An oracle node resolved for one concrete stage (layer substituted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OracleNode {
    /// e.g. `Qcur-3`.
    pub name: String,
    /// e.g. `ROPE`.
    pub op: String,
}

/// Match `id` against a pattern with at most one `{N}`; returns the layer text if it matches.
fn match_pattern<'a>(pattern: &str, id: &'a str) -> Option<Option<&'a str>> {
    match pattern.split_once("{N}") {
        None => (pattern == id).then_some(None),
        Some((prefix, suffix)) => {
            let rest = id.strip_prefix(prefix)?.strip_suffix(suffix)?;
            let ok = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit());
            ok.then_some(Some(rest))
        }
    }
}

impl StageMap {
    /// The oracle node that holds canonical stage `canonical` (e.g. `blk.3.q` → `Qcur-3` /
    /// `MUL_MAT`), or `None` if the map has no such stage.
    pub fn oracle_node(&self, canonical: &str) -> Option<OracleNode> {
        self.stages.iter().find_map(|m| {
            let layer = match_pattern(&m.canonical, canonical)?;
            let name = match layer {
                Some(n) => m.oracle_name.replace("{N}", n),
                None => m.oracle_name.clone(),
            };
            Some(OracleNode {
                name,
                op: m.op.clone(),
            })
        })
    }

    /// Whether the oracle is known not to expose canonical stage `canonical`.
    pub fn is_not_exposed(&self, canonical: &str) -> bool {
        self.not_exposed
            .iter()
            .any(|p| match_pattern(p, canonical).is_some())
    }
}

/// The oracle that made a golden.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct OracleInfo {
    /// e.g. `llama.cpp`.
    pub name: String,
    /// llama-cpp-python version (llama.cpp oracle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_cpp_python: Option<String>,
    /// The llama.cpp commit llama-cpp-python vendors (llama.cpp oracle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_cpp_commit: Option<String>,
    /// Anything else the oracle records (library versions, build info).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl OracleInfo {
    /// The CPU flags of the host that made the golden (`host_cpu_flags`, as `/proc/cpuinfo` spells them),
    /// if the oracle recorded them.
    pub fn host_cpu_flags(&self) -> Option<Vec<String>> {
        let v = self.extra.get("host_cpu_flags")?.as_array()?;
        v.iter().map(|f| f.as_str().map(str::to_string)).collect()
    }

    /// The CPU flags a non-native ggml-cpu build was compiled for (`ggml_cpu_flags`, recorded with
    /// `ggml_cpu_build` by goldens made with `LOCKSTEP_ORACLE_CPU=avx2`: an AVX2-only llama.cpp on a host
    /// that may have more), if the oracle recorded them.
    pub fn ggml_cpu_flags(&self) -> Option<Vec<String>> {
        let v = self.extra.get("ggml_cpu_flags")?.as_array()?;
        v.iter().map(|f| f.as_str().map(str::to_string)).collect()
    }

    /// True for a llama.cpp golden: the oracle whose arithmetic ggml mode reproduces bit for bit, so that
    /// bisect can read a reference-mode row above its floor against ggml mode (oracle-side rounding,
    /// [`crate::judge`]). False for transformers, whose float32 arithmetic ggml mode does not reproduce.
    pub fn is_llama_cpp(&self) -> bool {
        self.name == "llama.cpp"
    }

    /// The ggml-cpu build whose kernels made this golden, chosen from the flags it was compiled for:
    /// [`OracleInfo::ggml_cpu_flags`] where recorded (a build narrower than its host), else
    /// [`OracleInfo::host_cpu_flags`] (what `GGML_NATIVE` compiles for that CPU), through
    /// [`GgmlTarget::from_cpu_flags`]. Ggml mode mirrors it.
    ///
    /// Errors: no `host_cpu_flags` recorded, or a CPU ggml mode has no replicas for (neither AVX2+FMA nor
    /// AVX-512 F/DQ).
    pub fn ggml_target(&self) -> Result<GgmlTarget> {
        let flags = self.ggml_cpu_flags().or_else(|| self.host_cpu_flags()).with_context(|| {
            format!(
                "oracle {} records no host_cpu_flags: cannot tell which ggml-cpu kernels made this golden",
                self.name
            )
        })?;
        GgmlTarget::from_cpu_flags(&flags).with_context(|| {
            format!(
                "the oracle host's CPU flags {flags:?} have neither AVX2+FMA nor AVX-512 F/DQ: ggml mode \
                 has no replica of the kernels it ran"
            )
        })
    }
}

/// The settings the oracle ran with.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct OracleSettings {
    /// Threads used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_threads: Option<u32>,
    /// Context size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ctx: Option<u32>,
    /// Logical batch size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_batch: Option<u32>,
    /// Physical batch size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ubatch: Option<u32>,
    /// Flash attention (`disabled` / `enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attn: Option<String>,
    /// K-cache type (`f32`, `f16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_k: Option<String>,
    /// V-cache type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_v: Option<String>,
    /// RNG seed; `None` when nothing is sampled at random (greedy argmax).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Anything else recorded.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

pub use crate::npz::Dtype;

/// What the manifest says about one array of a golden.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ArraySpec {
    /// Shape, outermost first (numpy order).
    pub shape: Vec<usize>,
    /// Stored element type.
    pub dtype: Dtype,
    /// max |stored − captured| over the array (0 when stored at the captured precision).
    pub storage_max_abs_err: f64,
    /// `storage_max_abs_err` / RMS of the captured array.
    pub storage_max_rel_err: f64,
    /// Smallest cosine between a stored row and its captured row (1 when exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_min_cosine: Option<f64>,
}

/// One golden file as listed in the manifest.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct GoldenEntry {
    /// Path of the `.npz`, relative to the golden directory.
    pub path: String,
    /// sha256 of the `.npz` (lowercase hex).
    pub sha256: String,
    /// Size of the `.npz` in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// lockstep model id, e.g. `smollm2-135m-q4_1`.
    pub model_id: String,
    /// sha256 of the model file the golden was made from.
    pub model_sha256: String,
    /// File name of that model.
    pub model_file: String,
    /// Architecture (`general.architecture`), e.g. `llama`: selects the stage map.
    pub arch: String,
    /// Prompt id from `oracles/prompts.json`.
    pub prompt_id: String,
    /// `text` or `chat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_kind: Option<String>,
    /// The exact text tokenized (for a chat prompt: rendered with the model's chat template).
    pub prompt: String,
    /// Tokenizer flag: add the model's special tokens (BOS/EOS) if it is configured to.
    pub add_special: bool,
    /// Tokenizer flag: parse special-token text such as `<|im_start|>`.
    pub parse_special: bool,
    /// The oracle and its versions.
    pub oracle: OracleInfo,
    /// KV-cache type (`f32`, `f16`).
    pub kv_type: String,
    /// Settings the oracle ran with.
    pub settings: OracleSettings,
    /// `T`.
    pub n_prompt_tokens: usize,
    /// `N`.
    pub n_decode_steps: usize,
    /// `decode.tokens` as text.
    pub continuation: String,
    /// max |Δ| of the logits between the oracle run with and without capture hooks.
    pub capture_changes_logits: f64,
    /// Every array in the file.
    pub arrays: BTreeMap<String, ArraySpec>,
    /// Everything else recorded (tokenizer flags, stage policy, noise floor vs other KV types ...).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl GoldenEntry {
    /// The input kind of this golden's cells (`input` of the entry: absent or `{"kind": "tokens"}` →
    /// [`CellInput::Tokens`]; `{"kind": "audio", "path": …, "sha256": …}` → [`CellInput::Audio`]).
    ///
    /// Errors, naming the golden: another kind, or an audio input without its path or sha256.
    pub fn input(&self) -> Result<CellInput> {
        let Some(v) = self.extra.get("input") else {
            return Ok(CellInput::Tokens);
        };
        let field = |k: &str| v.get(k).and_then(|x| x.as_str());
        match field("kind") {
            Some("tokens") => Ok(CellInput::Tokens),
            Some("audio") => match (field("path"), field("sha256")) {
                (Some(path), Some(sha256)) => Ok(CellInput::Audio {
                    path: path.to_string(),
                    sha256: sha256.to_string(),
                }),
                _ => bail!(
                    "golden {}: an `audio` input needs its `path` (under the golden directory) and `sha256`",
                    self.path
                ),
            },
            other => bail!(
                "golden {}: input kind {other:?} is none of \"tokens\", \"audio\"",
                self.path
            ),
        }
    }

    /// True for a golden whose cells feed the engine audio ([`CellInput::Audio`]).
    pub fn is_audio(&self) -> bool {
        self.extra
            .get("input")
            .and_then(|v| v.get("kind"))
            .and_then(|k| k.as_str())
            == Some("audio")
    }

    /// True for an encoder's golden (manifest `output = "pooled"`): its output is the pooled embedding
    /// (`pooled`, `[1, D]`), compared as a stage; it has no logits and no decode steps.
    pub fn is_encoder(&self) -> bool {
        self.extra.get("output").and_then(|v| v.as_str()) == Some("pooled")
    }

    /// The canonical ids of the prefill stages this golden holds (arrays other than `tokens`,
    /// `logits*`, [`STAGE_POSITIONS`] and `decode.*`).
    pub fn prefill_stages(&self) -> impl Iterator<Item = &str> {
        self.arrays.keys().map(String::as_str).filter(|n| {
            *n != "tokens"
                && *n != STAGE_POSITIONS
                && !n.starts_with("logits")
                && !n.starts_with("decode.")
                && !n.starts_with(FLOOR_PREFIX)
                && !n.starts_with("greedy.")
        })
    }

    /// True for a compact golden: its prefill stages are stored at the prompt positions of the array
    /// [`STAGE_POSITIONS`] only, not at every position.
    pub fn is_compact(&self) -> bool {
        self.arrays.contains_key(STAGE_POSITIONS)
    }

    /// True when the golden stores some layer output (`blk.N.out`) at every prompt position: the input bisect
    /// injects into the next layer, so only such a golden can localize a divergence. False for a compact golden
    /// ([`GoldenEntry::is_compact`]): its rows at a few positions are not a layer's whole input.
    pub fn stores_layer_outputs(&self) -> bool {
        !self.is_compact()
            && self
                .arrays
                .keys()
                .any(|k| array_stage(k).is_some_and(|(s, decode)| !decode && s.is_layer_output()))
    }

    /// The canonical ids of the decode stages this golden holds (`decode.<id>` without the
    /// prefix, other than `tokens` and `logits`).
    pub fn decode_stages(&self) -> impl Iterator<Item = &str> {
        self.arrays
            .keys()
            .filter_map(|n| n.strip_prefix("decode."))
            .filter(|n| *n != "tokens" && *n != "logits")
    }
}

fn manifest_path(golden_dir: &Path) -> PathBuf {
    golden_dir.join(MANIFEST_FILE)
}

/// Read and parse `<golden_dir>/manifest.json`; fails on a missing file, bad JSON or a
/// `schema_version` other than [`SCHEMA_VERSION`].
pub fn load_manifest(golden_dir: &Path) -> Result<Manifest> {
    let path = manifest_path(golden_dir);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} cannot be read", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    match value.get("schema_version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(SCHEMA_VERSION) => {}
        Some(v) => bail!(
            "{}: schema_version is {v}, this lockstep reads schema_version {SCHEMA_VERSION}",
            path.display()
        ),
        None => bail!("{}: no integer schema_version", path.display()),
    }
    serde_json::from_value(value)
        .with_context(|| format!("{} does not match the manifest schema", path.display()))
}

/// Refuse a golden made from another model file: `model_sha256` is the sha256 of the model about
/// to be run.
pub fn check_model(golden_dir: &Path, entry: &GoldenEntry, model_sha256: &str) -> Result<()> {
    if !entry.model_sha256.eq_ignore_ascii_case(model_sha256) {
        bail!(
            "{} was made from model {} with sha256 {}, but the model being run has sha256 {}",
            golden_dir.join(&entry.path).display(),
            entry.model_file,
            entry.model_sha256,
            model_sha256
        );
    }
    Ok(())
}

/// [`check_model`] for the model registered as `model_id`: a golden of another model is accepted only when
/// the registry says `model_id` is the Hugging Face copy of the model the golden was made from (its
/// registered sha256 is the golden's `model_sha256`) and `model_sha256` is the copy's registered digest
/// ([`crate::hash::sha256_hf_dir`]). Never a skipped check.
///
/// Errors: as [`check_model`]; the registry does not parse.
pub fn check_model_for(
    golden_dir: &Path,
    entry: &GoldenEntry,
    model_id: &str,
    model_sha256: &str,
) -> Result<()> {
    if entry.model_sha256.eq_ignore_ascii_case(model_sha256) {
        return Ok(());
    }
    let registry = crate::registry::Registry::active()?;
    if let Some(source) = registry.hf_source(model_id) {
        let copy_ok = registry
            .sha256(model_id)
            .is_some_and(|s| s.eq_ignore_ascii_case(model_sha256));
        let source_ok = registry
            .sha256(source)
            .is_some_and(|s| s.eq_ignore_ascii_case(&entry.model_sha256));
        if copy_ok && source_ok {
            return Ok(());
        }
        bail!(
            "{} was made from model {} with sha256 {}; `{model_id}` is registered as the Hugging Face copy of \
             `{source}` (sha256 {}), but the copy being run has sha256 {model_sha256} (registered: {})",
            golden_dir.join(&entry.path).display(),
            entry.model_file,
            entry.model_sha256,
            registry.sha256(source).unwrap_or("?"),
            registry.sha256(model_id).unwrap_or("?"),
        );
    }
    check_model(golden_dir, entry, model_sha256)
}

pub use crate::hash::sha256_file;

/// The stage a golden (or dump) array holds, parsed once from its name: the canonical id
/// ([`lockstep_engine::Stage::parse`]) and whether the array holds the decode steps' rows (`decode.<id>`)
/// rather than the prompt's. `None` for `tokens`, `logits_*` arrays and any name that is not a canonical
/// stage id. The names on disk stay the canonical ids llama.cpp's nodes map to (`attn_norm-3` →
/// `blk.3.attn_norm`, through the manifest's stage map).
pub fn array_stage(name: &str) -> Option<(lockstep_engine::Stage, bool)> {
    match name.strip_prefix("decode.") {
        Some(id) => lockstep_engine::Stage::parse(id).map(|s| (s, true)),
        None => lockstep_engine::Stage::parse(name).map(|s| (s, false)),
    }
}

/// Hold a golden to its manifest entry before anything is compared with it: the file exists, its
/// sha256 matches, its arrays are exactly those listed, each with the listed shape and dtype, and its
/// contents are consistent ([`GoldenFile::verify_contents`]). Every error names the file (and array).
pub fn verify_golden(golden_dir: &Path, entry: &GoldenEntry) -> Result<()> {
    let path = golden_dir.join(&entry.path);
    let manifest = manifest_path(golden_dir);
    if !path.is_file() {
        bail!(
            "{} is missing (listed in {})",
            path.display(),
            manifest.display()
        );
    }
    let sha = sha256_file(&path)?;
    if !sha.eq_ignore_ascii_case(&entry.sha256) {
        bail!(
            "{}: sha256 is {sha}, but {} says {}",
            path.display(),
            manifest.display(),
            entry.sha256
        );
    }
    GoldenFile::open_unchecked(Npz::open(&path)?, entry.clone(), manifest)?.verify_contents()?;
    input_audio_path(golden_dir, entry).map(drop)
}

/// The checked input file of an audio golden ([`CellInput::Audio`]; `None` for a token golden): present
/// and with the sha256 the manifest lists.
///
/// Errors, naming the file and the manifest: missing, or another sha256.
pub fn input_audio_path(golden_dir: &Path, entry: &GoldenEntry) -> Result<Option<PathBuf>> {
    let CellInput::Audio { path, sha256 } = entry.input()? else {
        return Ok(None);
    };
    let file = golden_dir.join(&path);
    let manifest = manifest_path(golden_dir);
    if !file.is_file() {
        bail!(
            "{} (the input of golden {}) is missing (listed in {})",
            file.display(),
            entry.path,
            manifest.display()
        );
    }
    let sha = sha256_file(&file)?;
    if !sha.eq_ignore_ascii_case(&sha256) {
        bail!(
            "{}: sha256 is {sha}, but {} says {sha256} (the input of golden {})",
            file.display(),
            manifest.display(),
            entry.path
        );
    }
    Ok(Some(file))
}

/// The samples of an audio golden's input ([`input_audio_path`], read as 16 kHz mono by
/// [`lockstep_engine::audio::read_wav_16k_mono`]); `None` for a token golden.
///
/// Errors: as [`input_audio_path`]; a WAV that is not 16 kHz mono PCM (the engine's error, naming it).
pub fn read_input_audio(golden_dir: &Path, entry: &GoldenEntry) -> Result<Option<Vec<f32>>> {
    let Some(file) = input_audio_path(golden_dir, entry)? else {
        return Ok(None);
    };
    let samples = lockstep_engine::audio::read_wav_16k_mono(&file)
        .with_context(|| format!("the input of golden {}", entry.path))?;
    Ok(Some(samples))
}

/// Read one float array of a golden as f32 (f16 is widened exactly); a 1-D array comes back as
/// `[1, N]`. Checks the array against the manifest entry (not the file's sha256: call
/// [`verify_golden`] once for that).
pub fn read_array_f32(golden_dir: &Path, entry: &GoldenEntry, name: &str) -> Result<Array2<f32>> {
    GoldenFile::open(golden_dir, entry)?.read_f32(name)
}

/// Read the prompt's token ids (`tokens`).
pub fn read_tokens(golden_dir: &Path, entry: &GoldenEntry) -> Result<Vec<u32>> {
    GoldenFile::open(golden_dir, entry)?.read_tokens("tokens")
}

/// An open golden `.npz`, for reading many arrays without reopening the archive.
pub struct GoldenFile {
    path: PathBuf,
    manifest: PathBuf,
    entry: GoldenEntry,
    npz: Npz,
    /// Float arrays already decoded and checked ([`GoldenFile::read_f32`]): bisect compares the same golden
    /// in up to four passes. Bounded by [`F32_CACHE_BYTES`].
    cache: std::collections::HashMap<String, Array2<f32>>,
    cache_bytes: usize,
}

/// The most decoded f32 data one [`GoldenFile`] keeps (arrays beyond it are decoded again when read again).
const F32_CACHE_BYTES: usize = 512 << 20;

impl GoldenFile {
    /// Open the golden of `entry` (does not check the sha256; see [`verify_golden`]).
    pub fn open(golden_dir: &Path, entry: &GoldenEntry) -> Result<GoldenFile> {
        let path = golden_dir.join(&entry.path);
        let manifest = manifest_path(golden_dir);
        if !path.is_file() {
            bail!(
                "{} is missing (listed in {})",
                path.display(),
                manifest.display()
            );
        }
        GoldenFile::open_unchecked(Npz::open(&path)?, entry.clone(), manifest)
    }

    /// A golden held in memory, checked against `entry` as if `label` were its file and `manifest` its
    /// manifest (fuzzing and tests).
    pub fn from_bytes(
        bytes: Vec<u8>,
        entry: GoldenEntry,
        label: &Path,
        manifest: &Path,
    ) -> Result<GoldenFile> {
        GoldenFile::open_unchecked(
            Npz::from_bytes(bytes, label)?,
            entry,
            manifest.to_path_buf(),
        )
    }

    fn open_unchecked(npz: Npz, entry: GoldenEntry, manifest: PathBuf) -> Result<GoldenFile> {
        Ok(GoldenFile {
            path: npz.path().to_path_buf(),
            manifest,
            entry,
            npz,
            cache: Default::default(),
            cache_bytes: 0,
        })
    }

    /// The manifest entry this file was opened with.
    pub fn entry(&self) -> &GoldenEntry {
        &self.entry
    }

    /// Path of the `.npz`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The golden directory (where its manifest is).
    pub fn golden_dir(&self) -> &Path {
        self.manifest.parent().unwrap_or(Path::new("."))
    }

    /// The stage ids this golden stores for the prefill (`decode` false) or the decode steps (as
    /// [`GoldenEntry::prefill_stages`] and [`GoldenEntry::decode_stages`] list them), in the order of the file's members: the oracle's own
    /// forward order, since both oracles write each array as its node is computed (llama.cpp's graph order,
    /// `oracles/llamacpp/ggml_capture.py`; the order in which transformers' hooks fire,
    /// `oracles/transformers/tf_capture.py`). The first-divergent marker walks the stages in this order, not
    /// in the order an engine emits them: an engine that applies Q/K norm after RoPE emits `q_rope` first,
    /// but the reference's `q_norm` comes first and already differs. A listed stage the archive does not
    /// hold (an error [`GoldenFile::read_f32`] reports when it is read) keeps its place after the others.
    pub fn forward_order(&self, decode: bool) -> Vec<String> {
        let listed: Vec<&str> = if decode {
            self.entry.decode_stages().collect()
        } else {
            self.entry.prefill_stages().collect()
        };
        let prefix = if decode { "decode." } else { "" };
        let mut out: Vec<String> = Vec::with_capacity(listed.len());
        for m in self.npz.members() {
            let Some(id) = m.strip_suffix(".npy").and_then(|n| n.strip_prefix(prefix)) else {
                continue;
            };
            if listed.contains(&id) && !out.iter().any(|o| o == id) {
                out.push(id.to_string());
            }
        }
        for id in listed {
            if !out.iter().any(|o| o == id) {
                out.push(id.to_string());
            }
        }
        out
    }

    fn read_raw(&mut self, name: &str) -> Result<NpyArray> {
        let spec = self.entry.arrays.get(name).cloned().ok_or_else(|| {
            anyhow!(
                "{}: no array `{name}` is listed for this file in {}",
                self.path.display(),
                self.manifest.display()
            )
        })?;
        // the manifest's shape bounds what may be decompressed: a member larger than it is refused unread
        let want = data_bytes(&spec.shape, spec.dtype)
            .filter(|&n| n <= MAX_ARRAY_BYTES)
            .ok_or_else(|| {
                anyhow!(
                    "{}: {} lists array `{name}` with shape {:?} of {}, larger than the {MAX_ARRAY_BYTES} \
                     bytes an array may hold",
                    self.path.display(),
                    self.manifest.display(),
                    spec.shape,
                    spec.dtype
                )
            })?;
        if !self.npz.has(name) {
            bail!(
                "{}: array `{name}` (listed in {}) is not in the file",
                self.path.display(),
                self.manifest.display()
            );
        }
        let raw = self.npz.read(name, want).with_context(|| {
            format!(
                "{} lists array `{name}` of {} with shape {:?}",
                self.manifest.display(),
                spec.dtype,
                spec.shape
            )
        })?;
        if raw.shape != spec.shape {
            bail!(
                "{}: array `{name}` has shape {:?}, but {} says {:?}",
                self.path.display(),
                raw.shape,
                self.manifest.display(),
                spec.shape
            );
        }
        if raw.dtype != spec.dtype {
            bail!(
                "{}: array `{name}` has dtype {}, but {} says {}",
                self.path.display(),
                raw.dtype,
                self.manifest.display(),
                spec.dtype
            );
        }
        Ok(raw)
    }

    /// Read a float array as f32 (see [`read_array_f32`]). Errors: the array is not a float array, or
    /// holds NaN or ±Inf (a golden error naming the file, array, row and column).
    pub fn read_f32(&mut self, name: &str) -> Result<Array2<f32>> {
        if let Some(a) = self.cache.get(name) {
            return Ok(a.clone());
        }
        let raw = self.read_raw(name)?;
        let a = raw
            .to_f32()
            .with_context(|| format!("{}: array `{name}`", self.path.display()))?;
        if let Some((i, v)) = a.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            let cols = a.ncols().max(1);
            bail!(
                "{}: golden array `{name}` holds {v} at row {}, column {}: a golden must be finite",
                self.path.display(),
                i / cols,
                i % cols
            );
        }
        let bytes = a.len() * 4;
        if self.cache_bytes + bytes <= F32_CACHE_BYTES {
            self.cache_bytes += bytes;
            self.cache.insert(name.to_string(), a.clone());
        }
        Ok(a)
    }

    /// Read an i32 array; a 1-D array comes back as `[1, N]`.
    pub fn read_i32(&mut self, name: &str) -> Result<Array2<i32>> {
        let raw = self.read_raw(name)?;
        raw.to_i32()
            .with_context(|| format!("{}: array `{name}`", self.path.display()))
    }

    /// Read a 1-D i32 array of token ids (`tokens`, `decode.tokens`). Errors: not 1-D, a negative id.
    pub fn read_tokens(&mut self, name: &str) -> Result<Vec<u32>> {
        let a = self.read_i32(name)?;
        if a.nrows() != 1 || self.entry.arrays[name].shape.len() != 1 {
            bail!("{}: array `{name}` is not 1-D", self.path.display());
        }
        a.iter()
            .map(|&t| {
                u32::try_from(t).map_err(|_| {
                    anyhow!(
                        "{}: array `{name}` holds a negative token id {t}",
                        self.path.display()
                    )
                })
            })
            .collect()
    }

    /// The sequence a cell runs: the prompt's `tokens`, and the teacher-forced `decode.tokens` (empty
    /// when the golden has no decode steps).
    pub fn read_sequence(&mut self) -> Result<(Vec<u32>, Vec<u32>)> {
        let tokens = self.read_tokens("tokens")?;
        let decode = if self.entry.n_decode_steps > 0 {
            self.read_tokens("decode.tokens")?
        } else {
            Vec::new()
        };
        Ok((tokens, decode))
    }

    /// The prompt positions the prefill stages are stored at: `None` for a golden that stores them at every
    /// position, else the compact golden's [`STAGE_POSITIONS`] (row `r` of every prefill stage is position
    /// `positions[r]`).
    ///
    /// Errors, naming the file: the array is not 1-D, is empty, is not strictly increasing (unsorted or a
    /// position twice), or holds a position outside `0..n_prompt_tokens`.
    pub fn stage_positions(&mut self) -> Result<Option<Vec<usize>>> {
        if !self.entry.is_compact() {
            return Ok(None);
        }
        let path = self.path.display().to_string();
        let t = self.entry.n_prompt_tokens;
        let a = self.read_i32(STAGE_POSITIONS)?;
        if self.entry.arrays[STAGE_POSITIONS].shape.len() != 1 || a.is_empty() {
            bail!(
                "{path}: array `{STAGE_POSITIONS}` must be a non-empty 1-D list of prompt positions, but has shape {:?}",
                self.entry.arrays[STAGE_POSITIONS].shape
            );
        }
        let mut out: Vec<usize> = Vec::with_capacity(a.len());
        for (i, &p) in a.iter().enumerate() {
            let Some(p) = usize::try_from(p).ok().filter(|&p| p < t) else {
                bail!(
                    "{path}: array `{STAGE_POSITIONS}` holds {p} at index {i}, outside the prompt positions 0..{t}"
                );
            };
            if let Some(&prev) = out.last() {
                if p <= prev {
                    bail!(
                        "{path}: array `{STAGE_POSITIONS}` is not strictly increasing: {p} at index {i} after {prev}"
                    );
                }
            }
            out.push(p);
        }
        Ok(Some(out))
    }

    /// Read an i32 array of token ids (`logits_topk_ids`, ...) as `[rows, k]`, each id in `0..n_vocab`.
    /// Errors name the file, array and offending id.
    pub fn read_ids(&mut self, name: &str, n_vocab: usize) -> Result<Array2<u32>> {
        let a = self.read_i32(name)?;
        let path = self.path.display().to_string();
        let mut out = Array2::zeros(a.dim());
        for ((r, c), &id) in a.indexed_iter() {
            out[(r, c)] = u32::try_from(id)
                .ok()
                .filter(|&x| (x as usize) < n_vocab)
                .ok_or_else(|| {
                    anyhow!(
                        "{path}: array `{name}` holds token id {id} at row {r}, column {c}, outside the \
                         vocabulary 0..{n_vocab}"
                    )
                })?;
        }
        Ok(out)
    }

    /// Check everything a comparison relies on, before any comparison: the file's arrays are exactly
    /// the manifest's, each readable at its listed shape and dtype, floats finite, and the arrays agree
    /// with each other and with the entry (glossary in the module docs):
    ///
    /// - `tokens` is `[T]` with `T = n_prompt_tokens`, ids in `0..V` (`V` = `logits` columns);
    /// - `logits` is `[P, V]`, `logits_positions` `[P]` of distinct positions in `0..T` including `T-1`;
    /// - `logits_topk_ids` / `logits_topk` are equal `[T, K]` shapes with `K ≥ 1`, ids in `0..V`;
    /// - with `N = n_decode_steps > 0`: `decode.tokens` is `[N]` with ids in `0..V`, and `decode.logits`
    ///   `[N, V]` or `logits_decode_topk_ids` / `logits_decode_topk` `[N, K]` exist; with `N = 0` no
    ///   `decode.*` array does;
    /// - every prefill stage has `T` rows — in a compact golden one per position of `stage_positions`, a
    ///   strictly increasing `[S]` in `0..T` ([`GoldenFile::stage_positions`]) —, every decode stage `N`.
    ///
    /// Errors name the file and the array (a wrong `n_decode_steps` would otherwise silently compare
    /// fewer steps; a NaN would otherwise blame the engine).
    pub fn verify_contents(&mut self) -> Result<()> {
        let path = self.path.display().to_string();
        let manifest = self.manifest.display().to_string();
        let names = self.npz.array_names()?;
        let present: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        if let Some(extra) = present
            .iter()
            .find(|n| !self.entry.arrays.contains_key(**n))
        {
            bail!("{path}: array `{extra}` is not listed in {manifest}");
        }
        let missing: Vec<&str> = self
            .entry
            .arrays
            .keys()
            .map(String::as_str)
            .filter(|k| !present.contains(k))
            .collect();
        if !missing.is_empty() {
            bail!(
                "{path}: arrays listed in {manifest} are missing from the file: {}",
                missing.join(", ")
            );
        }
        let t = self.entry.n_prompt_tokens;
        let n = self.entry.n_decode_steps;
        if self.entry.is_encoder() {
            return self.verify_encoder_contents(&names);
        }
        if self.entry.is_audio() {
            return self.verify_audio_contents();
        }
        let logits = self.read_f32("logits")?;
        let v = logits.ncols();
        if v == 0 {
            bail!("{path}: array `logits` has no columns");
        }
        let tokens = self.read_tokens("tokens")?;
        if tokens.len() != t {
            bail!(
                "{path}: array `tokens` holds {} ids, but {manifest} says n_prompt_tokens = {t}",
                tokens.len()
            );
        }
        if t == 0 {
            bail!("{path}: the golden's prompt has no tokens");
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= v) {
            bail!("{path}: array `tokens` holds token id {bad}, outside the vocabulary 0..{v} of its logits");
        }
        let positions = self.read_i32("logits_positions")?;
        if self.entry.arrays["logits_positions"].shape.len() != 1 {
            bail!("{path}: array `logits_positions` is not 1-D");
        }
        if positions.len() != logits.nrows() {
            bail!(
                "{path}: `logits_positions` lists {} positions, `logits` holds {} rows",
                positions.len(),
                logits.nrows()
            );
        }
        let mut seen = BTreeSet::new();
        for &p in &positions {
            if p < 0 || p as usize >= t || !seen.insert(p) {
                bail!("{path}: `logits_positions` holds {p}: positions must be distinct and in 0..{t}");
            }
        }
        if !seen.contains(&((t - 1) as i32)) {
            bail!(
                "{path}: `logits_positions` lacks the last prompt position {}",
                t - 1
            );
        }
        self.check_topk("logits_topk_ids", "logits_topk", t, v)?;
        let stage_rows = self.stage_positions()?.map_or(t, |p| p.len());
        let decode_arrays: Vec<String> = names
            .iter()
            .filter(|a| a.starts_with("decode.") || a.starts_with("logits_decode"))
            .cloned()
            .collect();
        if n == 0 {
            if let Some(a) = decode_arrays.first() {
                bail!("{path}: array `{a}` holds decode steps, but {manifest} says n_decode_steps = 0");
            }
        } else {
            let dt = self.read_tokens("decode.tokens")?;
            if dt.len() != n {
                bail!(
                    "{path}: array `decode.tokens` holds {} steps, but {manifest} says n_decode_steps = {n}",
                    dt.len()
                );
            }
            if let Some(&bad) = dt.iter().find(|&&x| x as usize >= v) {
                bail!("{path}: array `decode.tokens` holds token id {bad}, outside the vocabulary 0..{v}");
            }
            if present.contains("decode.logits") {
                let d = self.read_f32("decode.logits")?;
                if d.dim() != (n, v) {
                    bail!(
                        "{path}: array `decode.logits` is {:?}, expected [{n}, {v}] (n_decode_steps × vocabulary)",
                        d.dim()
                    );
                }
            } else if present.contains("logits_decode_topk_ids") {
                self.check_topk("logits_decode_topk_ids", "logits_decode_topk", n, v)?;
            } else {
                bail!(
                    "{path}: {n} decode steps but neither `decode.logits` nor `logits_decode_topk_ids` is stored"
                );
            }
        }
        let stages: Vec<(String, usize)> = self
            .entry
            .prefill_stages()
            .map(|s| (s.to_string(), stage_rows))
            .chain(
                self.entry
                    .decode_stages()
                    .map(|s| (format!("decode.{s}"), n)),
            )
            .collect();
        for (name, rows) in stages {
            let a = self.read_f32(&name)?;
            if a.nrows() != rows || self.entry.arrays[&name].shape.len() != 2 {
                bail!(
                    "{path}: stage array `{name}` has shape {:?}, expected {rows} rows (one per {})",
                    self.entry.arrays[&name].shape,
                    if name.starts_with("decode.") {
                        "decode step"
                    } else if self.entry.is_compact() {
                        "position of `stage_positions`"
                    } else {
                        "prompt position"
                    }
                );
            }
        }
        Ok(())
    }

    /// [`GoldenFile::verify_contents`] for an audio golden ([`CellInput::Audio`]): `tokens` `[T]` and
    /// `logits` `[T, V]` (every prompt position, no `logits_positions`), ids in `0..V`; `decode.tokens` `[N]`
    /// and `decode.logits` `[N, V]` (N = n_decode_steps); every decode stage `[N, D]`; every decoder prefill
    /// stage `[T, D]` (the encoder's `mel`, `enc.…` and `blk.N.cross_k` / `cross_v` have a row per frame or
    /// encoder position); every stage has its `floor.<id>` `[1]`, ≥ 0 (finite: [`GoldenFile::read_f32`]).
    fn verify_audio_contents(&mut self) -> Result<()> {
        let path = self.path.display().to_string();
        let manifest = self.manifest.display().to_string();
        let (t, n) = (self.entry.n_prompt_tokens, self.entry.n_decode_steps);
        let tokens = self.read_tokens("tokens")?;
        if tokens.len() != t || t == 0 {
            bail!(
                "{path}: array `tokens` holds {} ids, but {manifest} says n_prompt_tokens = {t}",
                tokens.len()
            );
        }
        if self.entry.arrays.contains_key("logits_positions") || self.entry.is_compact() {
            bail!("{path}: an audio golden stores full logits at every prompt position and every stage's rows (no `logits_positions`, no `{STAGE_POSITIONS}`)");
        }
        let logits = self.read_f32("logits")?;
        let v = logits.ncols();
        if logits.nrows() != t || v == 0 {
            bail!(
                "{path}: array `logits` has shape {:?}, expected [{t}, V]",
                logits.dim()
            );
        }
        let decode = if n > 0 {
            self.read_tokens("decode.tokens")?
        } else {
            Vec::new()
        };
        if decode.len() != n {
            bail!(
                "{path}: array `decode.tokens` holds {} ids, but {manifest} says n_decode_steps = {n}",
                decode.len()
            );
        }
        if let Some(&bad) = tokens.iter().chain(&decode).find(|&&x| x as usize >= v) {
            bail!("{path}: token id {bad} is outside the vocabulary 0..{v} of its logits");
        }
        if n > 0 && self.read_f32("decode.logits")?.dim() != (n, v) {
            bail!("{path}: array `decode.logits` must be [{n}, {v}]");
        }
        let prefill: Vec<String> = self.entry.prefill_stages().map(str::to_string).collect();
        let decode_ids: Vec<String> = self
            .entry
            .decode_stages()
            .map(|s| format!("decode.{s}"))
            .collect();
        for name in prefill.iter().chain(&decode_ids) {
            let a = self.read_f32(name)?;
            let once = name == "mel"
                || name.starts_with("enc.")
                || name.ends_with(".cross_k")
                || name.ends_with(".cross_v");
            let rows = if name.starts_with("decode.") { n } else { t };
            if self.entry.arrays[name].shape.len() != 2 || (!once && a.nrows() != rows) {
                bail!(
                    "{path}: stage array `{name}` has shape {:?}, expected {rows} rows",
                    self.entry.arrays[name].shape
                );
            }
            let floor = format!("{FLOOR_PREFIX}{name}");
            if !self.entry.arrays.contains_key(&floor) {
                bail!(
                    "{path}: stage array `{name}` has no `{floor}` (its float32-vs-float64 NMSE)"
                );
            }
            let f = self.read_f32(&floor)?;
            if f.len() != 1 || f[(0, 0)] < 0.0 {
                bail!("{path}: `{floor}` must hold one finite NMSE ≥ 0, holds {f:?}");
            }
        }
        Ok(())
    }

    /// [`GoldenFile::verify_contents`] for an encoder's golden: `tokens` `[T]` (ids in the vocabulary of
    /// `model_hparams.n_vocab` when recorded), `n_decode_steps = 0` and no `decode.*` or `logits*` array,
    /// `pooled` `[1, D]`, every other stage `[T, D]`.
    fn verify_encoder_contents(&mut self, names: &[String]) -> Result<()> {
        let path = self.path.display().to_string();
        let manifest = self.manifest.display().to_string();
        let t = self.entry.n_prompt_tokens;
        if self.entry.n_decode_steps != 0 {
            bail!(
                "{path}: an encoder golden (output = pooled) with n_decode_steps = {} in {manifest}: an encoder has no decode step",
                self.entry.n_decode_steps
            );
        }
        if let Some(a) = names
            .iter()
            .find(|a| a.starts_with("decode.") || a.starts_with("logits"))
        {
            bail!("{path}: array `{a}` in an encoder golden (output = pooled): it has no logits and no decode steps");
        }
        let tokens = self.read_tokens("tokens")?;
        if tokens.len() != t || t == 0 {
            bail!(
                "{path}: array `tokens` holds {} ids, but {manifest} says n_prompt_tokens = {t}",
                tokens.len()
            );
        }
        let n_vocab = self
            .entry
            .extra
            .get("model_hparams")
            .and_then(|h| h.get("n_vocab"))
            .and_then(|v| v.as_u64());
        if let Some(v) = n_vocab {
            if let Some(&bad) = tokens.iter().find(|&&x| u64::from(x) >= v) {
                bail!("{path}: array `tokens` holds token id {bad}, outside the vocabulary 0..{v}");
            }
        }
        if !self.entry.arrays.contains_key("pooled") {
            bail!("{path}: an encoder golden (output = pooled) without the array `pooled`");
        }
        if self.entry.is_compact() {
            bail!("{path}: an encoder golden (output = pooled) with `{STAGE_POSITIONS}`: compact storage is for decoders' prompts");
        }
        let stages: Vec<String> = self.entry.prefill_stages().map(str::to_string).collect();
        for name in stages {
            let rows = if name == "pooled" { 1 } else { t };
            let a = self.read_f32(&name)?;
            if a.nrows() != rows || self.entry.arrays[&name].shape.len() != 2 {
                bail!(
                    "{path}: stage array `{name}` has shape {:?}, expected {rows} rows ({})",
                    self.entry.arrays[&name].shape,
                    if rows == 1 {
                        "one pooled row per sequence"
                    } else {
                        "one per prompt position"
                    }
                );
            }
        }
        Ok(())
    }

    fn check_topk(&mut self, ids: &str, vals: &str, rows: usize, n_vocab: usize) -> Result<()> {
        let path = self.path.display().to_string();
        let i = self.read_ids(ids, n_vocab)?;
        let x = self.read_f32(vals)?;
        if i.nrows() != rows || i.ncols() == 0 || x.dim() != i.dim() {
            bail!(
                "{path}: `{ids}` {:?} and `{vals}` {:?} must both be [{rows}, K] with K ≥ 1",
                i.dim(),
                x.dim()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_golden_accepts_the_registered_hf_copy_of_its_model_and_nothing_else() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden");
        let m = load_manifest(&dir).unwrap();
        let e = m
            .entry(&dir, "synth-llama/transformers-f32/synth.npz")
            .unwrap();
        let r = crate::registry::Registry::active().unwrap();
        let sha = |id: &str| r.sha256(id).unwrap().to_string();
        assert_eq!(e.model_sha256, sha("synth-llama"));
        check_model_for(&dir, e, "synth-llama", &sha("synth-llama")).unwrap();
        check_model_for(&dir, e, "synth-llama-hf", &sha("synth-llama-hf")).unwrap();
        // the copy with other bytes, another model's copy, a variant: refused, naming the golden
        for (id, s) in [
            ("synth-llama-hf", "0".repeat(64)),
            ("synth-qwen2-hf", sha("synth-qwen2-hf")),
            ("synth-llama-q8_0", sha("synth-llama-q8_0")),
            ("synth-llama", sha("synth-llama-hf")),
        ] {
            let err = format!("{:#}", check_model_for(&dir, e, id, &s).unwrap_err());
            assert!(
                err.contains("synth-llama/transformers-f32/synth.npz"),
                "{id}: {err}"
            );
        }
    }

    #[test]
    fn an_entry_names_its_input_kind_and_a_bad_one_is_refused_naming_the_golden() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../golden");
        let m = load_manifest(&dir).unwrap();
        let text = m
            .entry(&dir, "synth-llama/transformers-f32/synth.npz")
            .unwrap();
        assert_eq!(text.input().unwrap(), CellInput::Tokens);
        assert!(!text.is_audio());
        let audio = m
            .entry(&dir, "whisper-seeded/transformers-f32/chirp.npz")
            .unwrap();
        assert!(audio.is_audio());
        match audio.input().unwrap() {
            CellInput::Audio { path, sha256 } => {
                assert_eq!(path, "whisper-seeded/audio/chirp.wav");
                assert_eq!(sha256, sha256_file(&dir.join(&path)).unwrap());
            }
            other => panic!("{other:?}"),
        }
        // the stages of an audio golden are its stage arrays, not its floors or greedy tokens
        let stages: Vec<&str> = audio.prefill_stages().collect();
        assert!(stages.contains(&"mel") && stages.contains(&"enc.blk.0.k"));
        assert!(!stages
            .iter()
            .any(|s| s.starts_with(FLOOR_PREFIX) || s.starts_with("greedy.")));
        let mut e = audio.clone();
        e.extra
            .insert("input".into(), serde_json::json!({"kind": "video"}));
        let err = format!("{:#}", e.input().unwrap_err());
        assert!(err.contains("chirp.npz") && err.contains("video"), "{err}");
        e.extra.insert(
            "input".into(),
            serde_json::json!({"kind": "audio", "path": "x.wav"}),
        );
        let err = format!("{:#}", e.input().unwrap_err());
        assert!(err.contains("chirp.npz") && err.contains("sha256"), "{err}");
        e.extra.insert(
            "input".into(),
            serde_json::json!({"kind": "audio", "path": "whisper-seeded/audio/none.wav", "sha256": "0"}),
        );
        let err = format!("{:#}", read_input_audio(&dir, &e).unwrap_err());
        assert!(err.contains("none.wav") && err.contains("missing"), "{err}");
    }

    fn map() -> StageMap {
        StageMap {
            about: None,
            stages: vec![
                StageMapping {
                    oracle_name: "embd".into(),
                    op: "GET_ROWS".into(),
                    canonical: "embed".into(),
                },
                StageMapping {
                    oracle_name: "Qcur-{N}".into(),
                    op: "MUL_MAT".into(),
                    canonical: "blk.{N}.q".into(),
                },
                StageMapping {
                    oracle_name: "Qcur-{N}".into(),
                    op: "ROPE".into(),
                    canonical: "blk.{N}.q_rope".into(),
                },
            ],
            not_exposed: vec!["blk.{N}.attn_scores".into()],
            observed_nodes: vec![],
        }
    }

    #[test]
    fn stage_map_lookup_substitutes_the_layer() {
        let m = map();
        let node = |c: &str| m.oracle_node(c).map(|n| (n.name, n.op));
        assert_eq!(node("blk.12.q"), Some(("Qcur-12".into(), "MUL_MAT".into())));
        assert_eq!(node("blk.3.q_rope"), Some(("Qcur-3".into(), "ROPE".into())));
        assert_eq!(node("embed"), Some(("embd".into(), "GET_ROWS".into())));
        assert_eq!(node("blk.x.q"), None);
        assert_eq!(node("blk..q"), None);
        assert_eq!(node("blk.3.qq"), None);
        assert!(m.is_not_exposed("blk.7.attn_scores"));
        assert!(!m.is_not_exposed("blk.7.q"));
    }
}
