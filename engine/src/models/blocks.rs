//! The shared blocks every architecture is wired from, each computing *and* emitting its own stages —
//! the way llama.cpp's graph builders (`build_norm`, `build_attn`, `build_ffn` in src/llama-graph.cpp) name
//! every intermediate through `cb(cur, "attn_norm", il)`, and mistral.rs shares `layers.rs`.
//!
//! - [`Embedding`]: `token_embd` row lookup, optional scale (Gemma's √d) → `embed`;
//! - [`RmsNorm`]: RMSNorm with a weight, or LayerNorm with a weight and a bias ([`NormKind`]; StarCoder2,
//!   StableLM) → `attn_norm`, `ffn_norm`, post-norms, `output_norm`;
//! - [`Attention`]: Q/K/V projections (three matrices, or one fused `attn_qkv`: Phi-3) with optional biases
//!   (Qwen2) and per-head Q/K norms (Gemma 3, Qwen3),
//!   RoPE NORM or NeoX with a per-layer base, optional Q pre-scale, sliding window, logit soft-capping
//!   (Gemma 2), the output projection →
//!   `q`, `k`, `v`, `q_norm`, `k_norm`, `q_rope`, `k_rope`, `attn_out`, `attn_proj`;
//! - [`Ffn`]: gated FFN with SiLU (SwiGLU) or tanh-GELU (GeGLU), gate and up separate or fused in one
//!   `ffn_up` (Phi-3), or the non-gated `down(gelu(up))` with optional biases (StarCoder2) → `ffn_gate`,
//!   `ffn_up`, `ffn_act`, `ffn_out`;
//! - [`CrossAttention`]: an encoder–decoder's cross-attention (Whisper), keys and values of the encoder
//!   output computed once per input and kept in the [`KvCache`] → `cross_k`, `cross_v`, `cross_q`,
//!   `cross_attn_out`, `cross_attn_proj`;
//! - [`DecoderLayer`]: pre-norm residual wiring with optional post-norms (Gemma 2/3) and optional
//!   cross-attention (`cross_inp`, `cross_attn_norm`) → `ffn_inp`, `out`; with bidirectional attention it
//!   is an encoder stack's block (Whisper's, stages `enc.…`);
//! - [`OutputHead`]: final norm, output matrix, optional logit soft-cap → `output_norm`, `logits`;
//! - [`Decoder`]: embedding → layers → head, the forward pass of every decoder-only architecture here.
//!
//! An architecture module (`llama.rs`, `qwen2.rs`, `gemma3.rs`) reads its hyperparameters and builds a
//! [`Decoder`] from these blocks; it contains no arithmetic. The list of stages a model emits is whatever
//! these blocks emit (`Model::stages` records one forward step), never a hand-kept list.

use std::ops::Range;

use crate::backend::{Backend, MatmulScratch};
use crate::faults::{self, Fault};
use crate::gguf::GgufFile;
use crate::hooks::{self, Stage, StageKind, StageSink};
use crate::kv_cache::KvCache;
use crate::models::weights::{load_vector, Weight};
use crate::numerics::Numerics;
use crate::ops::{self, AttnShape};
use crate::quant;
use crate::workers;
use crate::Result;

/// What one forward call shares with every block: the file, the numerics mode, the backend and its scratch,
/// the stage sink, and the positions of the batch (`p0 .. p0 + n`).
pub(crate) struct Fwd<'a, 's> {
    pub g: &'a GgufFile,
    /// The session's numerics: mode, the ggml-cpu build ggml mode mirrors, and the kernel instruction set
    /// of the ops outside the matmuls (attention, RoPE, SwiGLU; the backend has its own).
    pub num: Numerics,
    pub backend: &'a dyn Backend,
    pub mm: &'a mut MatmulScratch,
    pub sink: Option<&'a mut (dyn StageSink + 's)>,
    /// Absolute position of the batch's first token.
    pub p0: usize,
    /// Tokens in the batch.
    pub n: usize,
    /// Whether the blocks run an encoder–decoder model's encoder stack: every stage they emit is then that
    /// stack's ([`Stage::in_encoder`], ids `enc.…`).
    pub enc: bool,
}

impl<'a, 's> Fwd<'a, 's> {
    /// A forward call over the batch at positions `p0 .. p0 + n` of a decoder stack (`enc` false: the
    /// encoder of a speech model sets it where its stack starts).
    pub fn new(
        g: &'a GgufFile,
        num: Numerics,
        backend: &'a dyn Backend,
        mm: &'a mut MatmulScratch,
        sink: Option<&'a mut (dyn StageSink + 's)>,
        p0: usize,
        n: usize,
    ) -> Self {
        Fwd {
            g,
            num,
            backend,
            mm,
            sink,
            p0,
            n,
            enc: false,
        }
    }

    /// Absolute positions of the batch.
    pub fn positions(&self) -> Range<usize> {
        self.p0..self.p0 + self.n
    }

    /// Hand `data` (`[n, width]`, width = `data.len() / n`) to the sink as `stage`; it may be replaced.
    pub fn emit(&mut self, stage: Stage, data: &mut [f32]) {
        let width = data.len() / self.n;
        let pos = self.positions();
        let mut sink = self.sink.as_deref_mut().map(|s| s as &mut dyn StageSink);
        let stage = if self.enc {
            stage.in_encoder(true)
        } else {
            stage
        };
        hooks::emit(&mut sink, stage, pos, width, data);
    }

    /// `out[t, r] = Σ_k w[r, k] · x[t, k]` for the batch (`x`: `[n, w.cols]`, `out`: `[n, w.rows]`).
    pub fn matmul(&mut self, w: &Weight, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.backend
            .matmul(&w.matrix(self.g), x, self.n, out, self.num, self.mm)
    }

    /// [`Fwd::matmul`] of several weights with one input, `outs[i] = x · ws[i]ᵀ`, through
    /// [`Backend::matmul_shared`] (which may run them together; the bits are each product's own).
    pub fn matmul_shared<const N: usize>(
        &mut self,
        ws: [&Weight; N],
        x: &[f32],
        mut outs: [&mut [f32]; N],
    ) -> Result<()> {
        let ms = ws.map(|w| w.matrix(self.g));
        self.backend
            .matmul_shared(&ms, x, self.n, &mut outs, self.num, self.mm)
    }
}

/// Resize a scratch buffer to `n` (contents unspecified) — allocation only when it grows past capacity.
#[inline]
pub(crate) fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    buf.resize(n, 0.0);
    &mut buf[..n]
}

/// `x[t, :] += bias` for every row (`ggml_add` with a broadcast `[width]` bias: one rounding per element).
pub(crate) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        ops::add_in_place(row, bias);
    }
}

/// Token embedding lookup: `x[t] = token_embd[tokens[t]] · scale` (`ggml_get_rows`, then `ggml_scale` when
/// `scale` is set: Gemma's `inp_scaled`, ×√d_model), plus, for models with learned absolute positions,
/// `position_embd[p0 + t]` (GPT-2: src/models/gpt2.cpp `ggml_get_rows(pos_embd, inp_pos)` added to the
/// token rows, the node "inpL"; Radford et al. 2019).
#[derive(Debug)]
pub struct Embedding {
    /// `[n_vocab, d_model]`.
    pub weight: Weight,
    /// Multiplier applied after the lookup.
    pub scale: Option<f32>,
    /// `position_embd.weight` `[n_ctx_train, d_model]`, when the file has one.
    pub positions: Option<Weight>,
}

impl Embedding {
    /// `x`: `[n, d_model]` ← rows of the embedding matrix (plus the position rows of `f.positions()`);
    /// emits `embed`.
    ///
    /// Errors: (with learned positions) a position beyond `position_embd`'s rows; token ids are checked by
    /// the caller ([`crate::models::Session`]).
    pub(crate) fn forward(&self, f: &mut Fwd, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let embd = self.weight.matrix(f.g);
        for (row, &tok) in x.chunks_exact_mut(self.weight.cols).zip(tokens) {
            quant::dequantize_row_with(embd.ty, embd.row(tok as usize), row, f.num.simd)?;
        }
        if let Some(s) = self.scale.filter(|_| !faults::is(Fault::EmbedScaleMissing)) {
            ops::scale(x, s);
        }
        if let Some(pos) = &self.positions {
            let m = pos.matrix(f.g);
            let mut prow = vec![0.0f32; pos.cols];
            let shift = usize::from(faults::is(Fault::PosEmbdOffset) && f.n == 1);
            for (p, row) in f.positions().zip(x.chunks_exact_mut(pos.cols)) {
                let p = p.saturating_sub(shift);
                if p >= pos.rows {
                    return Err(crate::Error::Model {
                        path: f.g.path().to_path_buf(),
                        what: format!(
                            "position {p} beyond position_embd's {} rows (the training context)",
                            pos.rows
                        ),
                    });
                }
                quant::dequantize_row_with(m.ty, m.row(p), &mut prow, f.num.simd)?;
                ops::add_in_place(row, &prow);
            }
        }
        f.emit(Stage::global(StageKind::Embed), x);
        Ok(())
    }
}

/// Which normalisation a model's norms are (llama.cpp `llm_norm_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm with a weight: `LLM_NORM_RMS` ([`ops::rms_norm`]).
    #[default]
    Rms,
    /// LayerNorm (mean removed) with a weight and, when the file has one, a bias: `LLM_NORM`
    /// ([`ops::layer_norm`]; StarCoder2, StableLM).
    Layer,
}

/// RMSNorm with a learned weight ([`ops::rms_norm`]; llama.cpp `build_norm(.., LLM_NORM_RMS, ..)`), or
/// LayerNorm with a weight and a bias ([`NormKind::Layer`]). The weight is used as the GGUF stores it (for
/// Gemma the converter has already added the `1 +`).
#[derive(Debug)]
pub struct RmsNorm {
    /// `[width]`: the normalised row length (d_model, or head_dim for per-head Q/K norms).
    pub weight: Vec<f32>,
    /// Epsilon inside the square root.
    pub eps: f32,
    /// RMSNorm or LayerNorm.
    pub kind: NormKind,
    /// `[width]`, added after the weight (LayerNorm's `<name>.bias`, when the file has it).
    pub bias: Option<Vec<f32>>,
}

impl RmsNorm {
    /// Load `name` (`[width]`).
    pub fn load(g: &GgufFile, name: &str, width: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: load_vector(g, name, width)?,
            eps,
            kind: NormKind::Rms,
            bias: None,
        })
    }

    /// Load the norm `prefix` of `kind`: `<prefix>.weight`, and for LayerNorm `<prefix>.bias` when the file
    /// has it.
    pub fn load_kind(
        g: &GgufFile,
        prefix: &str,
        width: usize,
        eps: f32,
        kind: NormKind,
    ) -> Result<RmsNorm> {
        let mut n = RmsNorm::load(g, &format!("{prefix}.weight"), width, eps)?;
        n.kind = kind;
        let bias = format!("{prefix}.bias");
        if kind == NormKind::Layer && g.tensor(&bias).is_ok() {
            n.bias = Some(load_vector(g, &bias, width)?);
        }
        Ok(n)
    }

    /// Normalise every `weight.len()`-long row of `x` in place, then emit it as `stage`.
    pub(crate) fn forward(&self, f: &mut Fwd, x: &mut [f32], stage: Stage) {
        let eps = if faults::is(Fault::NormEps) {
            self.eps * 0.1
        } else {
            self.eps
        };
        match self.kind {
            NormKind::Rms => ops::rms_norm(x, &self.weight, eps),
            NormKind::Layer => {
                let bias = self
                    .bias
                    .as_deref()
                    .filter(|_| !faults::is(Fault::LayerNormBiasDropped));
                ops::layer_norm(x, &self.weight, bias, eps, f.num)
            }
        }
        f.emit(stage, x);
    }
}

/// How a model rotates query/key pairs (llama.cpp `llama_rope_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Interleaved pairs `(2i, 2i+1)`: `LLAMA_ROPE_TYPE_NORM` ([`ops::rope_norm`]).
    Norm,
    /// Half-split pairs `(i, i + d/2)`: `LLAMA_ROPE_TYPE_NEOX` ([`ops::rope_neox`]).
    Neox,
    /// No rotation (`LLAMA_ROPE_TYPE_NONE`): positions come from a learned table added to the embedding
    /// ([`Embedding::positions`], GPT-2). No `q_rope`/`k_rope` stage is emitted.
    None,
}

/// Rotary position embedding of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Pair layout.
    pub kind: RopeKind,
    /// Base θ (`rope.freq_base`; Gemma 3's local layers use their own).
    pub base: f32,
    /// Rotated dimensions per head.
    pub dim: usize,
}

/// Activation buffers of [`Attention::forward`].
#[derive(Default)]
pub struct AttnBufs {
    /// The fused projection's output `[n, qw + 2·kvw]` (fused Q/K/V only).
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    rope: Vec<f32>,
    scores: Vec<f32>,
}

/// Tokens from which a batch's RoPE runs in parallel (below, one thread and the layer's own cache: a decode
/// step allocates nothing).
const ROPE_PAR_TOKENS: usize = 16;

/// Tokens per task of a batch's parallel RoPE (one angle cache each).
const ROPE_TASK_TOKENS: usize = 8;

/// One self-attention sub-layer: projections, optional biases and Q/K norms, RoPE, cached causal GQA,
/// output projection (llama.cpp `build_attn` and the Q/K/V lines of each `src/models/<arch>.cpp`).
#[derive(Debug)]
pub struct Attention {
    /// Block index (the KV-cache layer and the stage ids).
    pub layer: usize,
    /// The Q/K/V projections: three matrices, or one fused matrix.
    pub qkv: QkvWeights,
    /// `[d_model, n_head·head_dim]`.
    pub wo: Weight,
    /// `attn_output.bias` (`[d_model]`, StarCoder2), added after the output projection, when the file has it.
    pub wo_bias: Option<Vec<f32>>,
    /// Q/K/V biases (`attn_q.bias` ...; Qwen2), each added right after its projection when present
    /// (Whisper: Q and V only, its `k_proj` has none).
    pub bias: [Option<Vec<f32>>; 3],
    /// Bidirectional attention over the batch without a KV cache (an encoder stack's blocks: Whisper's
    /// `WhisperEncoderLayer`, no mask), instead of causal attention through the cache.
    pub bidirectional: bool,
    /// Per-head RMSNorms of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`; Gemma 3).
    pub qk_norm: Option<[RmsNorm; 2]>,
    /// Per-head RMSNorm of V without a weight (Gemma 4: `ggml_rms_norm(Vcur, eps)`; held as a norm whose
    /// weight is all ones — `x·s·1` is `x·s` exactly).
    pub v_norm: Option<RmsNorm>,
    /// RoPE of this layer.
    pub rope: Rope,
    /// RoPE frequency factors (`rope_freqs.weight`, `[head_dim/2]`; Gemma 4's full-attention layers),
    /// see [`ops::rope_cache_factors`].
    pub rope_freqs: Option<Vec<f32>>,
    /// `ggml_scale` of Q after RoPE (Gemma 3: `f_attention_scale`, with `kq_scale = 1`).
    pub q_scale: Option<f32>,
    /// Heads, scale, window.
    pub shape: AttnShape,
}

/// The Q/K/V projection weights of an [`Attention`], in the form the file has them (llama.cpp
/// `create_tensor_qkv`: `attn_qkv.weight` when the file has it, else `attn_{q,k,v}.weight`).
#[derive(Debug)]
pub enum QkvWeights {
    /// `attn_q` `[n_head·head_dim, d_model]`, `attn_k` and `attn_v` `[n_kv_head·head_dim, d_model]`.
    Separate {
        /// `attn_q.weight`.
        wq: Weight,
        /// `attn_k.weight`.
        wk: Weight,
        /// `attn_v.weight`.
        wv: Weight,
    },
    /// `attn_qkv.weight` `[n_head·head_dim + 2·n_kv_head·head_dim, d_model]` (Phi-3): ONE matmul — ggml's
    /// kernel choice depends on the row count, so three matmuls over its row ranges would not be the same
    /// computation — whose output rows are split into q, k, v (llama-graph.cpp `build_qkv`: views of
    /// "wqkv" at column offsets 0, n_embd_q, n_embd_q + n_embd_k).
    Fused(Weight),
    /// `attn_q` and `attn_k` only: the values are the keys' projection, before the key norm and RoPE
    /// (Gemma 4's `attention_k_eq_v` layers: models/gemma4.cpp "if v_proj is not present, use Kcur as
    /// Vcur"; allowed only where the architecture says so, [`AttnTensors::v_from_k`]).
    KeyAsValue {
        /// `attn_q.weight`.
        wq: Weight,
        /// `attn_k.weight`.
        wk: Weight,
    },
}

impl QkvWeights {
    /// `attn_qkv.weight` if the file has it (shape-checked), else the three separate matrices.
    fn load(
        g: &GgufFile,
        pre: &str,
        layer: usize,
        d_model: usize,
        (qw, kvw): (usize, usize),
        v_from_k: bool,
    ) -> Result<Self> {
        let name = |t: &str| format!("{pre}blk.{layer}.{t}.weight");
        let w = |t: &str, rows: usize| Weight::load(g, &name(t), Some(rows), Some(d_model));
        if g.tensor(&name("attn_qkv")).is_ok() {
            return Ok(QkvWeights::Fused(w("attn_qkv", qw + 2 * kvw)?));
        }
        if v_from_k && g.tensor(&name("attn_v")).is_err() {
            return Ok(QkvWeights::KeyAsValue {
                wq: w("attn_q", qw)?,
                wk: w("attn_k", kvw)?,
            });
        }
        Ok(QkvWeights::Separate {
            wq: w("attn_q", qw)?,
            wk: w("attn_k", kvw)?,
            wv: w("attn_v", kvw)?,
        })
    }
}

/// How an architecture configures one [`Attention`] (everything but the tensors themselves).
#[derive(Clone, Copy, Debug)]
pub struct AttnOptions {
    /// Heads, kq scale, window.
    pub shape: AttnShape,
    /// RoPE of the layer.
    pub rope: Rope,
    /// `ggml_scale` of Q after RoPE (Gemma 3), if any.
    pub q_scale: Option<f32>,
    /// Which optional tensors the layer has.
    pub tensors: AttnTensors,
    /// Epsilon of the Q/K norms.
    pub norm_eps: f32,
}

/// Which optional tensors an [`Attention`] has (the architecture says; they are then required).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnTensors {
    /// `attn_{q,k,v}.bias`, or the fused `attn_qkv.bias` when the file has that.
    pub bias: bool,
    /// `attn_{q,k}_norm.weight` (per-head, `[head_dim]`).
    pub qk_norm: bool,
    /// A weightless per-head RMSNorm of V (Gemma 4).
    pub v_norm: bool,
    /// `rope_freqs.weight` frequency factors (Gemma 4's full-attention layers).
    pub rope_freqs: bool,
    /// V may be absent (`attn_v`): then the values are the keys' projection (Gemma 4).
    pub v_from_k: bool,
    /// With `bias`: `attn_k` has no bias (Whisper's `k_proj`, `bias=False`), the other two have one.
    pub no_k_bias: bool,
}

impl Attention {
    /// Load block `layer`'s attention tensors (`blk.{layer}.attn_*`), shape-checked against `opts.shape`
    /// and `d_model`.
    pub fn load(
        g: &GgufFile,
        layer: usize,
        d_model: usize,
        opts: AttnOptions,
    ) -> Result<Attention> {
        Self::load_in(g, "", layer, d_model, opts)
    }

    /// [`Attention::load`] of the tensors `{pre}blk.{layer}.attn_*` (`pre` = `enc.` for an encoder stack).
    pub fn load_in(
        g: &GgufFile,
        pre: &str,
        layer: usize,
        d_model: usize,
        opts: AttnOptions,
    ) -> Result<Attention> {
        let AttnOptions {
            shape,
            rope,
            q_scale,
            tensors,
            norm_eps,
        } = opts;
        let (qw, kvw) = (
            shape.n_head * shape.head_dim,
            shape.n_kv_head * shape.head_dim,
        );
        let name = |t: &str| format!("{pre}blk.{layer}.{t}");
        let bias = if !tensors.bias {
            [None, None, None]
        } else if g.tensor(&name("attn_qkv.bias")).is_ok() {
            // the fused projection's bias `[qw + 2·kvw]` (GPT-2; build_qkv's `wqkv_b`), split as the
            // matmul's output is: adding it before or after the split is the same elementwise f32 add
            let b = load_vector(g, &name("attn_qkv.bias"), qw + 2 * kvw)?;
            [
                Some(b[..qw].to_vec()),
                Some(b[qw..qw + kvw].to_vec()),
                Some(b[qw + kvw..].to_vec()),
            ]
        } else {
            [
                Some(load_vector(g, &name("attn_q.bias"), qw)?),
                match tensors.no_k_bias {
                    true => None,
                    false => Some(load_vector(g, &name("attn_k.bias"), kvw)?),
                },
                Some(load_vector(g, &name("attn_v.bias"), kvw)?),
            ]
        };
        let qk_norm = if tensors.qk_norm {
            Some([
                RmsNorm::load(g, &name("attn_q_norm.weight"), shape.head_dim, norm_eps)?,
                RmsNorm::load(g, &name("attn_k_norm.weight"), shape.head_dim, norm_eps)?,
            ])
        } else {
            None
        };
        let v_norm = tensors.v_norm.then(|| RmsNorm {
            weight: vec![1.0; shape.head_dim],
            eps: norm_eps,
            kind: NormKind::Rms,
            bias: None,
        });
        let rope_freqs = if tensors.rope_freqs {
            Some(load_vector(g, "rope_freqs.weight", rope.dim / 2)?)
        } else {
            None
        };
        Ok(Attention {
            layer,
            qkv: QkvWeights::load(g, pre, layer, d_model, (qw, kvw), tensors.v_from_k)?,
            v_norm,
            rope_freqs,
            wo: Weight::load(g, &name("attn_output.weight"), Some(d_model), Some(qw))?,
            wo_bias: match g.tensor(&name("attn_output.bias")) {
                Ok(_) => Some(load_vector(g, &name("attn_output.bias"), d_model)?),
                Err(_) => None,
            },
            bias,
            bidirectional: false,
            qk_norm,
            rope,
            q_scale,
            shape,
        })
    }

    /// `out` (`[n, d_model]`) ← attention of the normed input `h` (`[n, d_model]`) over the cache, after
    /// writing this batch's keys and values at their positions.
    pub(crate) fn forward(
        &self,
        f: &mut Fwd,
        kv: &mut KvCache,
        h: &[f32],
        b: &mut AttnBufs,
        out: &mut [f32],
    ) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let AttnShape {
            n_head,
            n_kv_head,
            head_dim: hd,
            ..
        } = self.shape;
        let (n, p0, qw, kvw) = (f.n, f.p0, n_head * hd, n_kv_head * hd);
        let (q, k, v) = (
            sized(&mut b.q, n * qw),
            sized(&mut b.k, n * kvw),
            sized(&mut b.v, n * kvw),
        );

        // q = h·Wqᵀ (+ bq) [n, n_head·hd];  k, v = h·Wkᵀ (+ bk), h·Wvᵀ (+ bv) [n, n_kv_head·hd]
        match &self.qkv {
            QkvWeights::Separate { wq, wk, wv } => {
                f.matmul_shared([wq, wk, wv], h, [q, k, v])?;
            }
            QkvWeights::KeyAsValue { wq, wk } => {
                f.matmul_shared([wq, wk], h, [q, &mut *k])?;
                v.copy_from_slice(k);
            }
            QkvWeights::Fused(w) => {
                // qkv = h·Wqkvᵀ [n, qw + 2·kvw]; q, k, v are each row's column ranges
                let qkv = sized(&mut b.qkv, n * w.rows);
                f.matmul(w, h, qkv)?;
                let (ko, vo) = match faults::active() {
                    Some(Fault::FusedQkvSplit) => (qw + kvw, qw),
                    _ => (qw, qw + kvw),
                };
                for (t, row) in qkv.chunks_exact(w.rows).enumerate() {
                    q[t * qw..][..qw].copy_from_slice(&row[..qw]);
                    k[t * kvw..][..kvw].copy_from_slice(&row[ko..][..kvw]);
                    v[t * kvw..][..kvw].copy_from_slice(&row[vo..][..kvw]);
                }
            }
        }
        for (i, (out, kind)) in [
            (&mut *q, StageKind::Q),
            (&mut *k, StageKind::K),
            (&mut *v, StageKind::V),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(bias) = self.bias[i]
                .as_ref()
                .filter(|_| !faults::is(Fault::QkvBiasMissing))
            {
                add_bias(out, bias);
            }
            if let (1, None, Some(vb)) = (i, &self.bias[1], &self.bias[2]) {
                if faults::is(Fault::KProjBias) {
                    add_bias(out, vb);
                }
            }
            f.emit(st(kind), out);
        }

        // per-head RMSNorm of q and k (rows of head_dim)
        let norm_after_rope = faults::is(Fault::QkNormAfterRope);
        if let Some([qn, kn]) = self.qk_norm.as_ref().filter(|_| !norm_after_rope) {
            qn.forward(f, q, st(StageKind::QNorm));
            if !faults::is(Fault::KNormSkipped) {
                kn.forward(f, k, st(StageKind::KNorm));
            }
        }
        // V's weightless norm: no stage of its own (llama.cpp's "Vcur_normed" has no canonical id)
        if let Some(vn) = &self.v_norm {
            ops::rms_norm(v, &vn.weight, vn.eps);
        }

        // RoPE on q and k, each token at its own absolute position (the first `rope.dim` of each head)
        let fault = faults::active();
        if self.rope.kind != RopeKind::None {
            self.rotate(f, q, k, &mut b.rope);
            f.emit(st(StageKind::QRope), q);
            f.emit(st(StageKind::KRope), k);
        }
        if let Some([qn, kn]) = self.qk_norm.as_ref().filter(|_| norm_after_rope) {
            qn.forward(f, q, st(StageKind::QNorm));
            kn.forward(f, k, st(StageKind::KNorm));
        }
        if let Some(s) = self.q_scale {
            ops::scale(q, s);
        }

        // att = softmax(q·kᵀ·kq_scale + mask) · v, heads concatenated   [n, n_head·hd]
        let att = sized(&mut b.att, n * qw);
        let mut shape = self.shape;
        if fault == Some(Fault::AttnScale) {
            shape.kq_scale /= (hd as f32).sqrt();
        }
        if self.bidirectional {
            // an encoder block: every query sees the whole batch, nothing cached
            let causal = faults::is(Fault::EncoderCausalMask);
            ops::attention_no_cache(q, k, v, n, &shape, causal, att, f.num);
        } else {
            // write k, v of token t at position p0 + t
            for (t, (kt, vt)) in k.chunks_exact(kvw).zip(v.chunks_exact(kvw)).enumerate() {
                let at = if fault == Some(Fault::KvWritePosition) {
                    t
                } else {
                    p0 + t
                };
                kv.write(self.layer, at, kt, vt)?;
            }
            let scores = sized(&mut b.scores, ops::attention_scratch_len(p0 + n));
            // llama.cpp sums KQV in another order for a single-token batch than for a prompt batch
            let kqv = ops::ggml_kqv_order(n);
            // the query's position: the last key it may see (the whole batch without a causal mask)
            let causal_off = fault == Some(Fault::CausalMaskOff);
            let pos_of = |t: usize| if causal_off { p0 + n - 1 } else { p0 + t };
            ops::attention_batch(
                q, kv, self.layer, n, pos_of, &shape, scores, att, f.num, kqv,
            );
        }
        f.emit(st(StageKind::AttnOut), att);

        // out = att·Woᵀ (+ bo)                                [n, d_model]
        f.matmul(&self.wo, att, out)?;
        if let Some(bias) = &self.wo_bias {
            add_bias(out, bias);
        }
        f.emit(st(StageKind::AttnProj), out);
        Ok(())
    }

    /// RoPE of q (`[n, n_head·hd]`) and k (`[n, n_kv_head·hd]`) in place, each token at its absolute
    /// position `f.p0 + t`, over the first `rope.dim` dimensions of each head (`ggml_rope_ext`;
    /// [`ops::rope_norm_simd`] / [`ops::rope_neox_simd`]). `rope` is the angle-cache scratch.
    fn rotate(&self, f: &Fwd, q: &mut [f32], k: &mut [f32], rope: &mut Vec<f32>) {
        let fault = faults::active();
        let hd = self.shape.head_dim;
        let (n, p0, qw, kvw) = (f.n, f.p0, self.shape.n_head * hd, self.shape.n_kv_head * hd);
        let dim = match fault {
            Some(Fault::PartialRotaryDims) => hd,
            _ => self.rope.dim,
        };
        let rope = sized(rope, dim);
        let base = match fault {
            Some(Fault::RopeBase) => 10000.0,
            _ => self.rope.base,
        };
        let rotate = match (self.rope.kind, fault == Some(Fault::RopePairing)) {
            (RopeKind::Norm, false) | (RopeKind::Neox, true) => ops::rope_norm_simd,
            (RopeKind::Neox, false) | (RopeKind::Norm, true) => ops::rope_neox_simd,
            (RopeKind::None, _) => return,
        };
        let num = f.num;
        let factors = match fault {
            Some(Fault::RopeFreqFactorsIgnored) => None,
            _ => self.rope_freqs.as_deref(),
        };
        let rope_token = |t: usize, qt: &mut [f32], kt: &mut [f32], cache: &mut [f32]| {
            let pos = match fault {
                Some(Fault::RopeDecodePosition) if n == 1 => (p0 + t).saturating_sub(1),
                _ => p0 + t,
            };
            ops::rope_cache_factors(pos, base, dim, factors, cache);
            rotate(qt, hd, dim, cache, num);
            rotate(kt, hd, dim, cache, num);
        };
        if n >= ROPE_PAR_TOKENS && workers::threads() > 1 {
            // a prompt: runs of ROPE_TASK_TOKENS tokens in parallel on the engine's workers, each task
            // with its own angle cache (every token is rotated on its own, so the split changes nothing)
            let (q, k) = (&mut q[..n * qw], &mut k[..n * kvw]);
            let (tq, tk) = (ROPE_TASK_TOKENS * qw, ROPE_TASK_TOKENS * kvw);
            workers::for_each_chunk_pair_mut(q, tq, k, tk, |c, qs, ks| {
                let mut cache = vec![0.0f32; dim];
                for (j, (qt, kt)) in qs
                    .chunks_exact_mut(qw)
                    .zip(ks.chunks_exact_mut(kvw))
                    .enumerate()
                {
                    rope_token(c * ROPE_TASK_TOKENS + j, qt, kt, &mut cache);
                }
            });
        } else {
            for (t, (qt, kt)) in q
                .chunks_exact_mut(qw)
                .zip(k.chunks_exact_mut(kvw))
                .enumerate()
            {
                rope_token(t, qt, kt, rope);
            }
        }
    }
}

/// Cross-attention of a decoder block over an encoder's output (Whisper's `encoder_attn`: HF
/// `WhisperAttention` with `key_value_states`; whisper.cpp's `cross_attn_*` tensors): LayerNorm, the query
/// projection of the decoder stream, keys and values projected ONCE per input from the encoder output
/// (`CrossAttention::precompute`, kept in the session's [`KvCache`]: HF's `EncoderDecoderCache`,
/// whisper.cpp's `kv_cross`), attention without any mask, output projection.
#[derive(Debug)]
pub struct CrossAttention {
    /// Block index (stage ids, the cache slot).
    pub layer: usize,
    /// `cross_attn_norm` (LayerNorm with bias).
    pub norm: RmsNorm,
    /// `cross_attn_q.weight` `[n_head·head_dim, d_model]`.
    pub wq: Weight,
    /// `cross_attn_k.weight` (no bias: `k_proj` has `bias=False`).
    pub wk: Weight,
    /// `cross_attn_v.weight`.
    pub wv: Weight,
    /// `cross_attn_output.weight` `[d_model, n_head·head_dim]`.
    pub wo: Weight,
    /// Biases of the query, value and output projections (`[n_head·head_dim]`, `[..]`, `[d_model]`).
    pub bq: Vec<f32>,
    /// See [`CrossAttention::bq`].
    pub bv: Vec<f32>,
    /// See [`CrossAttention::bq`].
    pub bo: Vec<f32>,
    /// Heads and scale (1/√head_dim; no window, no soft-cap).
    pub shape: AttnShape,
}

impl CrossAttention {
    /// Load block `layer`'s `blk.{layer}.cross_attn_{norm,q,k,v,output}` tensors (LayerNorm epsilon `eps`).
    ///
    /// Errors: a missing or misshapen tensor (naming file and tensor).
    pub fn load(
        g: &GgufFile,
        layer: usize,
        d_model: usize,
        shape: AttnShape,
        eps: f32,
    ) -> Result<CrossAttention> {
        let qw = shape.n_head * shape.head_dim;
        let name = |t: &str| format!("blk.{layer}.cross_attn_{t}");
        let w = |t: &str, rows, cols| Weight::load(g, &name(t), Some(rows), Some(cols));
        Ok(CrossAttention {
            layer,
            norm: RmsNorm::load_kind(g, &name("norm"), d_model, eps, NormKind::Layer)?,
            wq: w("q.weight", qw, d_model)?,
            wk: w("k.weight", qw, d_model)?,
            wv: w("v.weight", qw, d_model)?,
            wo: w("output.weight", d_model, qw)?,
            bq: load_vector(g, &name("q.bias"), qw)?,
            bv: load_vector(g, &name("v.bias"), qw)?,
            bo: load_vector(g, &name("output.bias"), d_model)?,
            shape,
        })
    }

    /// The keys and values of the encoder output `enc` (`[f.n, d_model]`, `f.n` the encoder positions),
    /// emitted as `cross_k`, `cross_v` (rows are encoder positions) and kept in `kv` for every decode step.
    pub(crate) fn precompute(
        &self,
        f: &mut Fwd,
        kv: &mut KvCache,
        enc: &[f32],
        b: &mut AttnBufs,
    ) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let qw = self.wk.rows;
        let (k, v) = (sized(&mut b.k, f.n * qw), sized(&mut b.v, f.n * qw));
        f.matmul_shared([&self.wk, &self.wv], enc, [&mut *k, &mut *v])?;
        f.emit(st(StageKind::CrossK), k);
        add_bias(v, &self.bv);
        f.emit(st(StageKind::CrossV), v);
        kv.set_cross(self.layer, k, v, f.n);
        Ok(())
    }

    /// `out` (`[n, d_model]`) ← cross-attention of the normed decoder rows `h` (`[n, d_model]`) over the
    /// keys and values [`CrossAttention::precompute`] cached.
    ///
    /// Errors: no cached keys for this block (the decoder run before any input was encoded).
    pub(crate) fn forward(
        &self,
        f: &mut Fwd,
        kv: &KvCache,
        h: &[f32],
        b: &mut AttnBufs,
        out: &mut [f32],
    ) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let (k, v, n_enc) = kv.cross(self.layer).ok_or_else(|| {
            crate::Error::Invalid(
                "the decoder ran before its encoder: encode the audio first (no cross-attention keys)"
                    .into(),
            )
        })?;
        let (n, qw) = (f.n, self.wq.rows);
        let q = sized(&mut b.q, n * qw);
        f.matmul(&self.wq, h, q)?;
        add_bias(q, &self.bq);
        f.emit(st(StageKind::CrossQ), q);
        let att = sized(&mut b.att, n * qw);
        let fault = faults::active();
        if fault == Some(Fault::CrossKvFromDecoder) {
            // the fault: keys and values of the decoder rows themselves
            let (k, v) = (sized(&mut b.k, n * qw), sized(&mut b.v, n * qw));
            f.matmul_shared([&self.wk, &self.wv], h, [&mut *k, &mut *v])?;
            add_bias(v, &self.bv);
            ops::attention_cross(q, n, k, v, n, &self.shape, false, att, f.num);
        } else {
            let causal = fault == Some(Fault::CrossAttnCausal);
            ops::attention_cross(q, n, k, v, n_enc, &self.shape, causal, att, f.num);
        }
        f.emit(st(StageKind::CrossAttnOut), att);
        f.matmul(&self.wo, att, out)?;
        add_bias(out, &self.bo);
        f.emit(st(StageKind::CrossAttnProj), out);
        Ok(())
    }
}

/// The gate activation of a gated FFN (llama.cpp `llm_ffn_op_type` with `LLM_FFN_PAR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluAct {
    /// SiLU: SwiGLU ([`ops::swiglu`]).
    Silu,
    /// tanh-approximated GELU: GeGLU ([`ops::geglu`]).
    GeluTanh,
    /// The exact (erf) GELU of a non-gated FFN ([`ops::gelu_erf`]; HF `"gelu"`: Whisper's `fc1` → GELU →
    /// `fc2`). A gated FFN with it is refused at load.
    GeluErf,
}

/// Activation buffers of [`Ffn::forward`].
#[derive(Default)]
pub struct FfnBufs {
    /// The fused gate+up projection's output `[n, 2·d_ff]` (fused FFN only).
    fused: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

/// A feed-forward sub-layer: gated, `down(act(h·W_gateᵀ) ⊙ h·W_upᵀ)` (llama.cpp `build_ffn` with
/// `LLM_FFN_PAR`), with gate and up fused in one matrix (Phi-3: `build_ffn(up, .., LLM_FFN_SWIGLU,
/// LLM_FFN_SEQ)`, one matmul to `[n, 2·d_ff]` and `ggml_swiglu` over its two halves), or without a gate,
/// `down(gelu(h·W_upᵀ + b_up)) + b_down` (`LLM_FFN_GELU` + `LLM_FFN_SEQ`; StarCoder2). Biases are added
/// when the file has them.
#[derive(Debug)]
pub struct Ffn {
    /// Block index.
    pub layer: usize,
    /// `[d_ff, d_model]`; `None`: `up` is the fused gate+up matrix (`fused`) or the FFN is not gated (the
    /// activation is then GELU on the up projection).
    pub gate: Option<Weight>,
    /// Whether `up` holds gate and up fused (`[2·d_ff, d_model]`: rows `0..d_ff` the gate, `d_ff..2·d_ff` the
    /// up projection; `ggml_swiglu`, not swapped: the first half goes through the activation).
    pub fused: bool,
    /// `[d_ff, d_model]` (`[2·d_ff, d_model]` when `fused`).
    pub up: Weight,
    /// `[d_model, d_ff]`.
    pub down: Weight,
    /// `ffn_up.bias` (`[d_ff]`).
    pub up_bias: Option<Vec<f32>>,
    /// `ffn_down.bias` (`[d_model]`).
    pub down_bias: Option<Vec<f32>>,
    /// Gate activation (of a gated FFN).
    pub act: GluAct,
}

impl Ffn {
    /// Load block `layer`'s `ffn_gate` (when `gated`; a gated file without `ffn_gate` has the fused
    /// `ffn_up` of `2·d_ff` rows), `ffn_up`, `ffn_down`, and the `ffn_up.bias` and `ffn_down.bias` the
    /// file has.
    pub fn load(
        g: &GgufFile,
        layer: usize,
        dims: (usize, usize),
        act: GluAct,
        gated: bool,
    ) -> Result<Ffn> {
        Self::load_in(g, "", layer, dims, act, gated)
    }

    /// [`Ffn::load`] of the tensors `{pre}blk.{layer}.ffn_*` (`pre` = `enc.` for an encoder stack).
    pub fn load_in(
        g: &GgufFile,
        pre: &str,
        layer: usize,
        (d_model, d_ff): (usize, usize),
        act: GluAct,
        gated: bool,
    ) -> Result<Ffn> {
        let name = |t: &str| format!("{pre}blk.{layer}.{t}.weight");
        let bias = |t: &str, len: usize| {
            let n = format!("{pre}blk.{layer}.{t}.bias");
            g.tensor(&n)
                .ok()
                .map(|_| load_vector(g, &n, len))
                .transpose()
        };
        let gate = match g.tensor(&name("ffn_gate")) {
            Ok(_) if gated => Some(Weight::load(
                g,
                &name("ffn_gate"),
                Some(d_ff),
                Some(d_model),
            )?),
            // a gated FFN whose `ffn_up` has d_ff rows: the gate is missing, not a fused matrix misshapen
            Err(e)
                if gated
                    && g.tensor(&name("ffn_up"))
                        .is_ok_and(|t| t.dims.get(1) == Some(&(d_ff as u64))) =>
            {
                return Err(e)
            }
            _ => None,
        };
        let fused = gated && gate.is_none();
        let up_rows = if fused { 2 * d_ff } else { d_ff };
        Ok(Ffn {
            layer,
            gate,
            fused,
            up: Weight::load(g, &name("ffn_up"), Some(up_rows), Some(d_model))?,
            down: Weight::load(g, &name("ffn_down"), Some(d_model), Some(d_ff))?,
            up_bias: bias("ffn_up", d_ff)?,
            down_bias: bias("ffn_down", d_model)?,
            act,
        })
    }

    /// `out` (`[n, d_model]`) ← the FFN of the normed input `h` (`[n, d_model]`).
    pub(crate) fn forward(
        &self,
        f: &mut Fwd,
        h: &[f32],
        b: &mut FfnBufs,
        out: &mut [f32],
    ) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let d_ff = self.down.cols;
        if self.gate.is_none() && !self.fused {
            // out = W_down · gelu(h·W_upᵀ + b_up) + b_down
            let up = sized(&mut b.up, f.n * d_ff);
            f.matmul(&self.up, h, up)?;
            if let Some(bias) = &self.up_bias {
                add_bias(up, bias);
            }
            f.emit(st(StageKind::FfnUp), up);
            match self.act {
                GluAct::GeluErf => ops::gelu_erf(up),
                _ => ops::gelu(up, f.num.mode),
            }
            f.emit(st(StageKind::FfnAct), up);
            f.matmul(&self.down, up, out)?;
            if let Some(bias) = &self.down_bias {
                add_bias(out, bias);
            }
            f.emit(st(StageKind::FfnOut), out);
            return Ok(());
        }
        let (gate, up) = (sized(&mut b.gate, f.n * d_ff), sized(&mut b.up, f.n * d_ff));
        let fault = faults::active();
        let swapped = fault == Some(Fault::GateUpSwapped);
        match &self.gate {
            Some(w_gate) => {
                let (w_gate, w_up) = if swapped {
                    (&self.up, w_gate)
                } else {
                    (w_gate, &self.up)
                };
                // both products first: a sink that replaces the gate does not change the up projection
                f.matmul_shared([w_gate, w_up], h, [&mut *gate, &mut *up])?;
                f.emit(st(StageKind::FfnGate), gate);
                f.emit(st(StageKind::FfnUp), up);
            }
            None => {
                // [gate | up] = h·W_upᵀ [n, 2·d_ff]; the fault takes the halves the other way round
                let fused = sized(&mut b.fused, f.n * 2 * d_ff);
                f.matmul(&self.up, h, fused)?;
                let (go, uo) = if swapped { (d_ff, 0) } else { (0, d_ff) };
                for ((row, g), u) in fused
                    .chunks_exact(2 * d_ff)
                    .zip(gate.chunks_exact_mut(d_ff))
                    .zip(up.chunks_exact_mut(d_ff))
                {
                    g.copy_from_slice(&row[go..][..d_ff]);
                    u.copy_from_slice(&row[uo..][..d_ff]);
                }
                f.emit(st(StageKind::FfnGate), gate);
                f.emit(st(StageKind::FfnUp), up);
            }
        }
        // gate = act(gate) ⊙ up                               [n, d_ff]
        let act = match (fault, self.act) {
            (Some(Fault::WrongActivation { layer }), GluAct::Silu) if layer == self.layer => {
                GluAct::GeluTanh
            }
            (Some(Fault::WrongActivation { layer }), GluAct::GeluTanh) if layer == self.layer => {
                GluAct::Silu
            }
            (_, a) => a,
        };
        match act {
            GluAct::Silu => ops::swiglu(gate, up, d_ff, f.num),
            GluAct::GeluTanh => ops::geglu(gate, up, d_ff, f.num.mode),
            GluAct::GeluErf => {
                return Err(crate::Error::Unsupported(format!(
                    "{}: a gated FFN with the erf GELU (block {}) is not implemented",
                    f.g.path().display(),
                    self.layer
                )))
            }
        }
        f.emit(st(StageKind::FfnAct), gate);
        f.matmul(&self.down, gate, out)?;
        f.emit(st(StageKind::FfnOut), out);
        Ok(())
    }
}

/// One pre-norm transformer block (Xiong et al. 2020), with the optional post-norms of Gemma 2/3:
///
/// ```text
/// x = x + post_attn_norm?(attn(attn_norm(x)))     → ffn_inp
/// x = x + post_ffn_norm?(ffn(ffn_norm(x)))        → out
/// ```
#[derive(Debug)]
pub struct DecoderLayer {
    /// Block index.
    pub layer: usize,
    /// Norm before attention.
    pub attn_norm: RmsNorm,
    /// Self-attention.
    pub attn: Attention,
    /// Norm of the attention output before the residual add (`post_attention_norm`).
    pub attn_post_norm: Option<RmsNorm>,
    /// Norm before the FFN.
    pub ffn_norm: RmsNorm,
    /// Cross-attention over an encoder's output, between self-attention and the FFN (Whisper's
    /// `encoder_attn`); `None` for decoder-only models.
    pub cross: Option<CrossAttention>,
    /// Feed-forward.
    pub ffn: Ffn,
    /// Norm of the FFN output before the residual add (`post_ffw_norm`).
    pub ffn_post_norm: Option<RmsNorm>,
    /// Multiplier of the block's output (`blk.N.layer_output_scale.weight`, one value; Gemma 4's
    /// `layer_scalar`: models/gemma4.cpp "out_scaled", `ggml_mul` by the one-element tensor), when the file
    /// has it.
    pub out_scale: Option<f32>,
}

/// Activation buffers of a [`Decoder`] forward pass (resized, never shrunk: no allocation once warm).
#[derive(Default)]
pub struct Activations {
    /// Residual stream `[n, d_model]`.
    x: Vec<f32>,
    layer: LayerBufs,
    /// `[n, n_vocab]`.
    pub logits: Vec<f32>,
}

/// Buffers of one [`DecoderLayer`] forward.
#[derive(Default)]
pub(crate) struct LayerBufs {
    /// Normed input of a sub-layer `[n, d_model]`.
    h: Vec<f32>,
    /// Sub-layer output `[n, d_model]`.
    proj: Vec<f32>,
    attn: AttnBufs,
    ffn: FfnBufs,
}

impl DecoderLayer {
    /// One block over the residual stream `x` (`[n, d_model]`), in place.
    pub(crate) fn forward(
        &self,
        f: &mut Fwd,
        kv: &mut KvCache,
        x: &mut [f32],
        b: &mut LayerBufs,
    ) -> Result<()> {
        let st = |kind| Stage::block(self.layer, kind);
        let n = x.len();
        let LayerBufs { h, proj, attn, ffn } = b;
        let (h, proj) = (sized(h, n), sized(proj, n));
        h.copy_from_slice(x);
        self.attn_norm.forward(f, h, st(StageKind::AttnNorm));
        self.attn.forward(f, kv, h, attn, proj)?;
        if let Some(n) = &self.attn_post_norm {
            n.forward(f, proj, st(StageKind::AttnPostNorm));
        }
        ops::add_in_place(x, proj);
        if let Some(c) = &self.cross {
            // x = x + cross_attn(cross_attn_norm(x))          → ffn_inp
            f.emit(st(StageKind::CrossInp), x);
            h.copy_from_slice(x);
            c.norm.forward(f, h, st(StageKind::CrossAttnNorm));
            c.forward(f, kv, h, attn, proj)?;
            ops::add_in_place(x, proj);
        }
        f.emit(st(StageKind::FfnInp), x);

        h.copy_from_slice(x);
        self.ffn_norm.forward(f, h, st(StageKind::FfnNorm));
        self.ffn.forward(f, h, ffn, proj)?;
        if let Some(n) = &self.ffn_post_norm {
            n.forward(f, proj, st(StageKind::FfnPostNorm));
        }
        if faults::active() == Some(Fault::MissingResidual { layer: self.layer }) {
            x.copy_from_slice(proj);
        } else {
            ops::add_in_place(x, proj);
        }
        if let Some(s) = self.out_scale {
            ops::scale(x, s);
        }
        f.emit(st(StageKind::Out), x);
        Ok(())
    }
}

/// Final norm and output matrix (llama.cpp `result_norm`, `result_output`).
#[derive(Debug)]
pub struct OutputHead {
    /// `output_norm`.
    pub norm: RmsNorm,
    /// `[n_vocab, d_model]`: `output.weight`, or `token_embd.weight` when the file ties them.
    pub weight: Weight,
    /// `logits = cap · tanh(logits · (1/cap))` (Gemma 2 `final_logit_softcapping`: llama.cpp `ggml_scale`,
    /// `ggml_tanh`, `ggml_scale`); `None` for most models.
    pub softcap: Option<f32>,
}

impl OutputHead {
    /// `output_norm.weight`, and `output.weight` or else the tied `token_embd` (`tied`).
    pub fn load(
        g: &GgufFile,
        d_model: usize,
        n_vocab: usize,
        norm_eps: f32,
        tied: &Weight,
    ) -> Result<OutputHead> {
        let weight = match g.tensor("output.weight") {
            Ok(_) => Weight::load(g, "output.weight", Some(n_vocab), Some(d_model))?,
            Err(_) => tied.clone(),
        };
        Ok(OutputHead {
            norm: RmsNorm::load(g, "output_norm.weight", d_model, norm_eps)?,
            weight,
            softcap: None,
        })
    }
}

/// How an architecture wires the shared blocks into a [`Decoder`]: everything [`Decoder::load`] needs
/// besides the file and its dimensions.
pub struct Wiring<'a> {
    /// Multiplier of the embedding rows (Gemma: √d_model).
    pub embed_scale: Option<f32>,
    /// Norms of the attention and FFN outputs before the residual adds (`post_attention_norm`,
    /// `post_ffw_norm`; Gemma 2/3).
    pub post_norms: bool,
    /// Gate activation of the FFN.
    pub act: GluAct,
    /// Whether the FFN is gated (`ffn_gate`); else `down(gelu(up))` ([`Ffn`]).
    pub gated_ffn: bool,
    /// RMSNorm or LayerNorm, for every norm of the model but per-head Q/K norms.
    pub norm: NormKind,
    /// The attention options of block `l`.
    pub attn: &'a dyn Fn(usize) -> AttnOptions,
    /// Final logit soft-capping (Gemma 2 `final_logit_softcapping`), see [`OutputHead::softcap`].
    pub final_softcap: Option<f32>,
}

/// A decoder-only transformer: embedding, blocks, output head.
#[derive(Debug)]
pub struct Decoder {
    /// Token embedding.
    pub embed: Embedding,
    /// The blocks, in order.
    pub layers: Vec<DecoderLayer>,
    /// Final norm and logits.
    pub head: OutputHead,
}

impl Decoder {
    /// Look up and shape-check every tensor of a decoder with dimensions `c`, wired as `w` (GGUF names:
    /// `token_embd`, `blk.{l}.attn_norm`, `blk.{l}.attn_*`, `blk.{l}.ffn_*`, `output_norm`, `output`).
    ///
    /// Errors: a missing or misshapen tensor, an unsupported type — naming the file and tensor.
    pub fn load(
        g: &GgufFile,
        c: &crate::models::hparams::DecoderDims,
        w: &Wiring,
    ) -> Result<Decoder> {
        let d = c.d_model;
        let positions = match g.tensor("position_embd.weight") {
            Ok(_) => Some(Weight::load(
                g,
                "position_embd.weight",
                Some(c.n_ctx_train),
                Some(d),
            )?),
            Err(_) => None,
        };
        let embed = Embedding {
            weight: Weight::load(g, "token_embd.weight", None, Some(d))?,
            scale: w.embed_scale,
            positions,
        };
        let layers = (0..c.n_layer)
            .map(|l| {
                let norm =
                    |t: &str| RmsNorm::load_kind(g, &format!("blk.{l}.{t}"), d, c.norm_eps, w.norm);
                let post = |t: &str| w.post_norms.then(|| norm(t)).transpose();
                Ok(DecoderLayer {
                    layer: l,
                    attn_norm: norm("attn_norm")?,
                    attn: Attention::load(g, l, d, (w.attn)(l))?,
                    attn_post_norm: post("post_attention_norm")?,
                    ffn_norm: norm("ffn_norm")?,
                    cross: None,
                    ffn: Ffn::load(g, l, (d, c.d_ff), w.act, w.gated_ffn)?,
                    ffn_post_norm: post("post_ffw_norm")?,
                    out_scale: match g.tensor(&format!("blk.{l}.layer_output_scale.weight")) {
                        Ok(_) => Some(
                            load_vector(g, &format!("blk.{l}.layer_output_scale.weight"), 1)?[0],
                        ),
                        Err(_) => None,
                    },
                })
            })
            .collect::<Result<_>>()?;
        let mut head = OutputHead::load(g, d, c.n_vocab, c.norm_eps, &embed.weight)?;
        head.norm = RmsNorm::load_kind(g, "output_norm", d, c.norm_eps, w.norm)?;
        head.softcap = w.final_softcap;
        Ok(Decoder {
            embed,
            layers,
            head,
        })
    }

    /// One forward pass over `tokens` at positions `f.positions()`; logits land in `act.logits`
    /// (`[n, n_vocab]`).
    pub(crate) fn forward(
        &self,
        f: &mut Fwd,
        kv: &mut KvCache,
        act: &mut Activations,
        tokens: &[u32],
        last_only: bool,
    ) -> Result<()> {
        let d = self.embed.weight.cols;
        let n = tokens.len();
        let Activations { x, layer, logits } = act;
        let x = sized(x, n * d);

        self.embed.forward(f, tokens, x)?;
        for l in &self.layers {
            l.forward(f, kv, x, layer)?;
        }

        // logits = RMSNorm(x)·w_output_norm · W_outᵀ               [rows, n_vocab]
        // over every row, or only the last one (llama.cpp's `inp_out_ids` when a batch asks for the last
        // position's logits alone: the head then sees — and its stages are — that one row)
        let row0 = if last_only { n - 1 } else { 0 };
        let rows = n - row0;
        let h = sized(&mut layer.h, rows * d);
        h.copy_from_slice(&x[row0 * d..]);
        let batch = (f.p0, f.n);
        (f.p0, f.n) = (f.p0 + row0, rows);
        let head = self.head_forward(f, h, logits);
        (f.p0, f.n) = batch;
        head
    }

    /// The output head over the `f.n` rows of `h` (`[f.n, d]`, normalised in place): `output_norm`, then
    /// `logits` (`[f.n, n_vocab]`, in `logits`).
    fn head_forward(&self, f: &mut Fwd, h: &mut [f32], logits: &mut Vec<f32>) -> Result<()> {
        let n = f.n;
        if faults::is(Fault::FinalNormSkipped) {
            f.emit(Stage::global(StageKind::OutputNorm), h);
        } else {
            self.head
                .norm
                .forward(f, h, Stage::global(StageKind::OutputNorm));
        }
        let logits = sized(logits, n * self.head.weight.rows);
        f.matmul(&self.head.weight, h, logits)?;
        if let Some(cap) = self
            .head
            .softcap
            .filter(|_| !faults::is(Fault::SoftcapMissing))
        {
            ops::scale(logits, 1.0 / cap);
            logits.iter_mut().for_each(|v| *v = v.tanh());
            ops::scale(logits, cap);
        }
        f.emit(Stage::global(StageKind::Logits), logits);
        Ok(())
    }
}
