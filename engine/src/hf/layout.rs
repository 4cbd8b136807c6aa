//! The one place per architecture where the Hugging Face and GGUF layouts differ: a table of tensor names
//! with the transform between the two, and a table of `config.json` fields against GGUF metadata keys. Both
//! directions use the same tables: [`super::open_dir`] (HF → GGUF, the engine loading a directory) and
//! `lockstep export-hf` (GGUF → HF).
//!
//! Sources: llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel.permute` for the Q/K rows, `Gemma2Model` /
//! `Gemma3Model` norm `+ 1`, `GPT2Model`'s Conv1D transposes, `Gemma4Model.generate_extra_tensors` for
//! `rope_freqs`) and gguf-py's `tensor_mapping.py`; transformers' `integrations/ggml.py` and
//! `modeling_gguf_pytorch_utils.py` (the reverse, with its traps patched in `oracles/transformers/tf_capture.py`);
//! the config classes of transformers 5.23 (`LlamaConfig`, `Gemma2Config`, `Gemma4TextConfig`, `GPT2Config`, ...).

/// How a tensor's data differs between the two layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transform {
    /// The same bytes: HF shape `[rows, cols]` is GGUF `ne = [cols, rows]`.
    Same,
    /// HF GPT-2's `Conv1D` stores `[in, out]`; GGUF (and `nn.Linear`) `[out, in]`.
    Transpose,
    /// llama-family Q/K rows: per head, HF keeps the two RoPE halves `[2, D/2]`, GGUF interleaved pairs
    /// `[D/2, 2]` (`LlamaModel.permute`). `Query`: `head_count` heads; `Key`: `head_count_kv`.
    RopePermute(Heads),
    /// Gemma 2/3 RMSNorm weights: HF stores `w - 1` (the module multiplies by `1 + w`), GGUF `w`.
    NormOffset,
    /// A PyTorch `Conv1d` weight `[out, in, k]` (HF) read as the matrix `[out, in·k]` (GGUF): the same
    /// bytes, the kernel width `k` given (Whisper's encoder convolutions, `k` = 3).
    Flatten(usize),
}

/// Which head count a [`Transform::RopePermute`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heads {
    /// `attention.head_count`.
    Query,
    /// `attention.head_count_kv` (default `head_count`).
    Key,
}

/// One tensor of an architecture: GGUF name, HF name (`{N}` is the layer), transform, and whether a model
/// may lack it (an untied output head, Gemma 4's V projection on its V = K layers).
#[derive(Clone, Copy, Debug)]
pub struct TensorRule {
    /// GGUF name, `{N}` for the layer.
    pub gguf: &'static str,
    /// HF name, `{N}` for the layer.
    pub hf: &'static str,
    /// The transform between them.
    pub transform: Transform,
    /// A model may lack it.
    pub optional: bool,
}

const fn t(gguf: &'static str, hf: &'static str) -> TensorRule {
    TensorRule {
        gguf,
        hf,
        transform: Transform::Same,
        optional: false,
    }
}

const fn tx(gguf: &'static str, hf: &'static str, transform: Transform) -> TensorRule {
    TensorRule {
        gguf,
        hf,
        transform,
        optional: false,
    }
}

const fn opt(gguf: &'static str, hf: &'static str) -> TensorRule {
    TensorRule {
        gguf,
        hf,
        transform: Transform::Same,
        optional: true,
    }
}

/// One `config.json` field against the GGUF metadata. GGUF keys are relative to `<arch>.` unless they start
/// with `tokenizer.`; HF keys are dotted paths into `config.json` (`rope_parameters.rope_theta`).
#[derive(Clone, Copy, Debug)]
pub enum Cfg {
    /// An integer in both.
    U32(&'static str, &'static str),
    /// An integer, optional in both (absent / `null` in one = absent in the other).
    U32Opt(&'static str, &'static str),
    /// An integer the GGUF may lack (llama.cpp's default given) and HF always has.
    U32Or(&'static str, &'static str, u32),
    /// A float in both.
    F32(&'static str, &'static str),
    /// A float the GGUF may lack (llama.cpp's default given) and HF always has.
    F32Or(&'static str, &'static str, f32),
    /// An HF field with the one value the engine implements (JSON text): written on export, checked on load
    /// when present.
    Const(&'static str, &'static str),
    /// A GGUF bool with the one value the engine implements: checked on export, written on load.
    MetaBool(&'static str, bool),
    /// A GGUF float the HF config does not carry, the value the HF model hard-codes: written on load,
    /// checked on export (Whisper's LayerNorm epsilon, PyTorch's default 1e-5).
    MetaF32(&'static str, f32),
    /// A GGUF key the HF config does not carry, because llama.cpp (and the engine) ignore it (the reason).
    Ignored(&'static str, &'static str),
    /// HF `head_dim` (the field named) = GGUF `attention.key_length` = `attention.value_length` (default
    /// `embedding_length / head_count`).
    HeadDim(&'static str),
    /// An HF field that must equal the head width (Gemma's `query_pre_attn_scalar`: llama.cpp scales Q by
    /// `1/sqrt(key_length)`).
    EqualsHeadDim(&'static str),
    /// GGUF `rope.dimension_count` = head width × the HF field named (`partial_rotary_factor`), or the whole
    /// head where `None`.
    RopeDims(Option<&'static str>),
    /// HF `layer_types` against llama.cpp's sliding-window pattern of `n` (layer `il` slides iff
    /// `il % n < n - 1`; the GGUF has no pattern key).
    SwaPattern(u32),
    /// Gemma 4's two head widths, its per-layer pattern and both RoPEs (see [`super::open_dir`]).
    Gemma4,
}

/// An architecture the engine implements, as both formats describe it.
#[derive(Clone, Copy, Debug)]
pub struct ArchLayout {
    /// `general.architecture`.
    pub arch: &'static str,
    /// `config.json` `architectures[0]`: the transformers class.
    pub hf_class: &'static str,
    /// `config.json` `model_type`.
    pub model_type: &'static str,
    /// Every tensor.
    pub tensors: &'static [TensorRule],
    /// Every hyperparameter.
    pub config: &'static [Cfg],
}

use Cfg::*;
use Heads::*;
use Transform::{Flatten, NormOffset, RopePermute, Transpose};

const COMMON_DIMS: &[Cfg] = &[
    U32("block_count", "num_hidden_layers"),
    U32("context_length", "max_position_embeddings"),
    U32("embedding_length", "hidden_size"),
    U32("feed_forward_length", "intermediate_size"),
    U32("attention.head_count", "num_attention_heads"),
    U32("attention.head_count_kv", "num_key_value_heads"),
    Ignored(
        "vocab_size",
        "the vocabulary is token_embd's rows (config.json vocab_size)",
    ),
];

/// Concatenate `&[T]` constants into one `&'static [T]` at compile time (`fill`: any value of `T`, overwritten).
macro_rules! const_concat {
    ($ty:ty, $fill:expr; $($part:expr),* $(,)?) => {{
        const PARTS: &[&[$ty]] = &[$($part),*];
        const N: usize = {
            let mut n = 0;
            let mut i = 0;
            while i < PARTS.len() {
                n += PARTS[i].len();
                i += 1;
            }
            n
        };
        const OUT: [$ty; N] = {
            let mut out = [$fill; N];
            let (mut n, mut i) = (0, 0);
            while i < PARTS.len() {
                let mut j = 0;
                while j < PARTS[i].len() {
                    out[n] = PARTS[i][j];
                    n += 1;
                    j += 1;
                }
                i += 1;
            }
            out
        };
        &OUT
    }};
}

/// The config rules of several groups, in order.
macro_rules! cfg_list {
    ($($part:expr),* $(,)?) => { const_concat!(Cfg, Cfg::Ignored("", ""); $($part),*) };
}

/// The tensor rules of several groups, in order.
macro_rules! tensor_list {
    ($($part:expr),* $(,)?) => { const_concat!(TensorRule, t("", ""); $($part),*) };
}

const RMS: &[Cfg] = &[F32("attention.layer_norm_rms_epsilon", "rms_norm_eps")];
const ROPE: &[Cfg] = &[
    F32("rope.freq_base", "rope_parameters.rope_theta"),
    Const("rope_parameters.rope_type", r#""default""#),
];
const SILU: &[Cfg] = &[Const("hidden_act", r#""silu""#)];

const EMBD_OUT: &[TensorRule] = &[
    t("token_embd.weight", "model.embed_tokens.weight"),
    t("output_norm.weight", "model.norm.weight"),
    opt("output.weight", "lm_head.weight"),
];
const ATTN_NORM_FFN_NORM: &[TensorRule] = &[
    t(
        "blk.{N}.attn_norm.weight",
        "model.layers.{N}.input_layernorm.weight",
    ),
    t(
        "blk.{N}.ffn_norm.weight",
        "model.layers.{N}.post_attention_layernorm.weight",
    ),
];
const QKVO: &[TensorRule] = &[
    t(
        "blk.{N}.attn_q.weight",
        "model.layers.{N}.self_attn.q_proj.weight",
    ),
    t(
        "blk.{N}.attn_k.weight",
        "model.layers.{N}.self_attn.k_proj.weight",
    ),
    t(
        "blk.{N}.attn_v.weight",
        "model.layers.{N}.self_attn.v_proj.weight",
    ),
    t(
        "blk.{N}.attn_output.weight",
        "model.layers.{N}.self_attn.o_proj.weight",
    ),
];
const QKV_BIAS: &[TensorRule] = &[
    t(
        "blk.{N}.attn_q.bias",
        "model.layers.{N}.self_attn.q_proj.bias",
    ),
    t(
        "blk.{N}.attn_k.bias",
        "model.layers.{N}.self_attn.k_proj.bias",
    ),
    t(
        "blk.{N}.attn_v.bias",
        "model.layers.{N}.self_attn.v_proj.bias",
    ),
];
const GATED_FFN: &[TensorRule] = &[
    t(
        "blk.{N}.ffn_gate.weight",
        "model.layers.{N}.mlp.gate_proj.weight",
    ),
    t(
        "blk.{N}.ffn_up.weight",
        "model.layers.{N}.mlp.up_proj.weight",
    ),
    t(
        "blk.{N}.ffn_down.weight",
        "model.layers.{N}.mlp.down_proj.weight",
    ),
];
const QK_NORM: &[TensorRule] = &[
    t(
        "blk.{N}.attn_q_norm.weight",
        "model.layers.{N}.self_attn.q_norm.weight",
    ),
    t(
        "blk.{N}.attn_k_norm.weight",
        "model.layers.{N}.self_attn.k_norm.weight",
    ),
];
const LN_BIASES: &[TensorRule] = &[
    t("output_norm.bias", "model.norm.bias"),
    t(
        "blk.{N}.attn_norm.bias",
        "model.layers.{N}.input_layernorm.bias",
    ),
    t(
        "blk.{N}.ffn_norm.bias",
        "model.layers.{N}.post_attention_layernorm.bias",
    ),
];

/// Gemma 2/3: every RMSNorm weight `w - 1` in HF, and the four norms of a Gemma block.
const GEMMA23: &[TensorRule] = &[
    t("token_embd.weight", "model.embed_tokens.weight"),
    tx("output_norm.weight", "model.norm.weight", NormOffset),
    opt("output.weight", "lm_head.weight"),
    tx(
        "blk.{N}.attn_norm.weight",
        "model.layers.{N}.input_layernorm.weight",
        NormOffset,
    ),
    tx(
        "blk.{N}.post_attention_norm.weight",
        "model.layers.{N}.post_attention_layernorm.weight",
        NormOffset,
    ),
    tx(
        "blk.{N}.ffn_norm.weight",
        "model.layers.{N}.pre_feedforward_layernorm.weight",
        NormOffset,
    ),
    tx(
        "blk.{N}.post_ffw_norm.weight",
        "model.layers.{N}.post_feedforward_layernorm.weight",
        NormOffset,
    ),
];
const GEMMA_CFG: &[Cfg] = &[
    Const("hidden_activation", r#""gelu_pytorch_tanh""#),
    Const("attention_bias", "false"),
    HeadDim("head_dim"),
    EqualsHeadDim("query_pre_attn_scalar"),
];

/// The architectures: one entry each, used by both directions.
pub const LAYOUTS: &[ArchLayout] = &[
    ArchLayout {
        arch: "llama",
        hf_class: "LlamaForCausalLM",
        model_type: "llama",
        tensors: tensor_list![
            EMBD_OUT,
            ATTN_NORM_FFN_NORM,
            &[
                tx(
                    "blk.{N}.attn_q.weight",
                    "model.layers.{N}.self_attn.q_proj.weight",
                    RopePermute(Query)
                ),
                tx(
                    "blk.{N}.attn_k.weight",
                    "model.layers.{N}.self_attn.k_proj.weight",
                    RopePermute(Key)
                ),
                t("blk.{N}.attn_v.weight", "model.layers.{N}.self_attn.v_proj.weight"),
                t(
                    "blk.{N}.attn_output.weight",
                    "model.layers.{N}.self_attn.o_proj.weight"
                ),
            ],
            GATED_FFN,
        ],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            ROPE,
            SILU,
            &[
                HeadDim("head_dim"),
                RopeDims(None),
                Const("attention_bias", "false"),
                Const("mlp_bias", "false"),
            ],
        ],
    },
    ArchLayout {
        arch: "qwen2",
        hf_class: "Qwen2ForCausalLM",
        model_type: "qwen2",
        tensors: tensor_list![EMBD_OUT, ATTN_NORM_FFN_NORM, QKVO, QKV_BIAS, GATED_FFN],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            ROPE,
            SILU,
            &[RopeDims(None), Const("use_sliding_window", "false")],
        ],
    },
    ArchLayout {
        arch: "qwen3",
        hf_class: "Qwen3ForCausalLM",
        model_type: "qwen3",
        tensors: tensor_list![EMBD_OUT, ATTN_NORM_FFN_NORM, QKVO, QK_NORM, GATED_FFN],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            ROPE,
            SILU,
            &[
                HeadDim("head_dim"),
                RopeDims(None),
                Const("attention_bias", "false"),
                Const("use_sliding_window", "false"),
            ],
        ],
    },
    ArchLayout {
        arch: "gemma2",
        hf_class: "Gemma2ForCausalLM",
        model_type: "gemma2",
        tensors: tensor_list![GEMMA23, QKVO, GATED_FFN],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            ROPE,
            GEMMA_CFG,
            &[
                RopeDims(None),
                F32Or("attn_logit_softcapping", "attn_logit_softcapping", 50.0),
                F32Or("final_logit_softcapping", "final_logit_softcapping", 30.0),
                U32Or("attention.sliding_window", "sliding_window", 4096),
                SwaPattern(2),
            ],
        ],
    },
    ArchLayout {
        arch: "gemma3",
        hf_class: "Gemma3ForCausalLM",
        model_type: "gemma3_text",
        tensors: tensor_list![
            GEMMA23,
            QKVO,
            &[
                tx(
                    "blk.{N}.attn_q_norm.weight",
                    "model.layers.{N}.self_attn.q_norm.weight",
                    NormOffset
                ),
                tx(
                    "blk.{N}.attn_k_norm.weight",
                    "model.layers.{N}.self_attn.k_norm.weight",
                    NormOffset
                ),
            ],
            GATED_FFN,
        ],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            GEMMA_CFG,
            &[
                F32(
                    "rope.freq_base",
                    "rope_parameters.full_attention.rope_theta"
                ),
                Const("rope_parameters.full_attention.rope_type", r#""default""#),
                F32Or(
                    "rope.freq_base_swa",
                    "rope_parameters.sliding_attention.rope_theta",
                    10000.0
                ),
                Const(
                    "rope_parameters.sliding_attention.rope_type",
                    r#""default""#
                ),
                RopeDims(None),
                U32("attention.sliding_window", "sliding_window"),
                SwaPattern(6),
                Const("final_logit_softcapping", "null"),
                Const("attn_logit_softcapping", "null"),
            ],
        ],
    },
    ArchLayout {
        arch: "gemma4",
        hf_class: "Gemma4ForCausalLM",
        model_type: "gemma4_text",
        tensors: &[
            t("token_embd.weight", "model.embed_tokens.weight"),
            t("output_norm.weight", "model.norm.weight"),
            opt("output.weight", "lm_head.weight"),
            t("blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"),
            t(
                "blk.{N}.post_attention_norm.weight",
                "model.layers.{N}.post_attention_layernorm.weight",
            ),
            t(
                "blk.{N}.ffn_norm.weight",
                "model.layers.{N}.pre_feedforward_layernorm.weight",
            ),
            t(
                "blk.{N}.post_ffw_norm.weight",
                "model.layers.{N}.post_feedforward_layernorm.weight",
            ),
            t("blk.{N}.attn_q.weight", "model.layers.{N}.self_attn.q_proj.weight"),
            t("blk.{N}.attn_k.weight", "model.layers.{N}.self_attn.k_proj.weight"),
            opt("blk.{N}.attn_v.weight", "model.layers.{N}.self_attn.v_proj.weight"),
            t(
                "blk.{N}.attn_output.weight",
                "model.layers.{N}.self_attn.o_proj.weight",
            ),
            t(
                "blk.{N}.attn_q_norm.weight",
                "model.layers.{N}.self_attn.q_norm.weight",
            ),
            t(
                "blk.{N}.attn_k_norm.weight",
                "model.layers.{N}.self_attn.k_norm.weight",
            ),
            t("blk.{N}.ffn_gate.weight", "model.layers.{N}.mlp.gate_proj.weight"),
            t("blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.up_proj.weight"),
            t("blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"),
            t(
                "blk.{N}.layer_output_scale.weight",
                "model.layers.{N}.layer_scalar",
            ),
        ],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            &[
                Gemma4,
                Const("hidden_activation", r#""gelu_pytorch_tanh""#),
                Const("attention_bias", "false"),
                Const("enable_moe_block", "false"),
                Const("use_double_wide_mlp", "false"),
                U32("attention.sliding_window", "sliding_window"),
                U32Opt("attention.shared_kv_layers", "num_kv_shared_layers"),
                U32Opt(
                    "embedding_length_per_layer_input",
                    "hidden_size_per_layer_input"
                ),
                F32Or("final_logit_softcapping", "final_logit_softcapping", 30.0),
            ],
        ],
    },
    ArchLayout {
        arch: "phi3",
        hf_class: "Phi3ForCausalLM",
        model_type: "phi3",
        tensors: tensor_list![
            EMBD_OUT,
            ATTN_NORM_FFN_NORM,
            &[
                t(
                    "blk.{N}.attn_qkv.weight",
                    "model.layers.{N}.self_attn.qkv_proj.weight"
                ),
                t(
                    "blk.{N}.attn_output.weight",
                    "model.layers.{N}.self_attn.o_proj.weight"
                ),
                t("blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.gate_up_proj.weight"),
                t("blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"),
            ],
        ],
        config: cfg_list![
            COMMON_DIMS,
            RMS,
            ROPE,
            SILU,
            &[
                RopeDims(Some("rope_parameters.partial_rotary_factor")),
                U32Opt(
                    "rope.scaling.original_context_length",
                    "original_max_position_embeddings"
                ),
                Ignored(
                    "attention.sliding_window",
                    "llama.cpp disables Phi-3's sliding window (src/models/phi3.cpp); config.json says null"
                ),
                Const("sliding_window", "null"),
                Const("pad_token_id", "null"),
            ],
        ],
    },
    ArchLayout {
        arch: "starcoder2",
        hf_class: "Starcoder2ForCausalLM",
        model_type: "starcoder2",
        tensors: tensor_list![
            EMBD_OUT,
            ATTN_NORM_FFN_NORM,
            LN_BIASES,
            QKVO,
            QKV_BIAS,
            &[
                t(
                    "blk.{N}.attn_output.bias",
                    "model.layers.{N}.self_attn.o_proj.bias"
                ),
                t("blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.c_fc.weight"),
                t("blk.{N}.ffn_up.bias", "model.layers.{N}.mlp.c_fc.bias"),
                t("blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.c_proj.weight"),
                t("blk.{N}.ffn_down.bias", "model.layers.{N}.mlp.c_proj.bias"),
            ],
        ],
        config: cfg_list![
            COMMON_DIMS,
            ROPE,
            &[
                F32("attention.layer_norm_epsilon", "norm_epsilon"),
                RopeDims(None),
                Const("hidden_act", r#""gelu_pytorch_tanh""#),
                Const("use_bias", "true"),
                Const("sliding_window", "null"),
            ],
        ],
    },
    ArchLayout {
        arch: "stablelm",
        hf_class: "StableLmForCausalLM",
        model_type: "stablelm",
        tensors: tensor_list![
            EMBD_OUT,
            ATTN_NORM_FFN_NORM,
            LN_BIASES,
            QKVO,
            QKV_BIAS,
            GATED_FFN
        ],
        config: cfg_list![
            COMMON_DIMS,
            ROPE,
            SILU,
            &[
                F32("attention.layer_norm_epsilon", "layer_norm_eps"),
                RopeDims(Some("rope_parameters.partial_rotary_factor")),
                Const("use_qkv_bias", "true"),
                Const("qk_layernorm", "false"),
                Const("use_parallel_residual", "false"),
            ],
        ],
    },
    ArchLayout {
        arch: "gpt2",
        hf_class: "GPT2LMHeadModel",
        model_type: "gpt2",
        tensors: &[
            t("token_embd.weight", "transformer.wte.weight"),
            t("position_embd.weight", "transformer.wpe.weight"),
            t("output_norm.weight", "transformer.ln_f.weight"),
            t("output_norm.bias", "transformer.ln_f.bias"),
            opt("output.weight", "lm_head.weight"),
            t("blk.{N}.attn_norm.weight", "transformer.h.{N}.ln_1.weight"),
            t("blk.{N}.attn_norm.bias", "transformer.h.{N}.ln_1.bias"),
            tx(
                "blk.{N}.attn_qkv.weight",
                "transformer.h.{N}.attn.c_attn.weight",
                Transpose,
            ),
            t("blk.{N}.attn_qkv.bias", "transformer.h.{N}.attn.c_attn.bias"),
            tx(
                "blk.{N}.attn_output.weight",
                "transformer.h.{N}.attn.c_proj.weight",
                Transpose,
            ),
            t("blk.{N}.attn_output.bias", "transformer.h.{N}.attn.c_proj.bias"),
            t("blk.{N}.ffn_norm.weight", "transformer.h.{N}.ln_2.weight"),
            t("blk.{N}.ffn_norm.bias", "transformer.h.{N}.ln_2.bias"),
            tx(
                "blk.{N}.ffn_up.weight",
                "transformer.h.{N}.mlp.c_fc.weight",
                Transpose,
            ),
            t("blk.{N}.ffn_up.bias", "transformer.h.{N}.mlp.c_fc.bias"),
            tx(
                "blk.{N}.ffn_down.weight",
                "transformer.h.{N}.mlp.c_proj.weight",
                Transpose,
            ),
            t("blk.{N}.ffn_down.bias", "transformer.h.{N}.mlp.c_proj.bias"),
        ],
        config: &[
            U32("block_count", "n_layer"),
            U32("context_length", "n_positions"),
            U32("embedding_length", "n_embd"),
            U32("feed_forward_length", "n_inner"),
            U32("attention.head_count", "n_head"),
            F32("attention.layer_norm_epsilon", "layer_norm_epsilon"),
            Ignored(
                "vocab_size",
                "the vocabulary is token_embd's rows (config.json vocab_size)",
            ),
            Const("activation_function", r#""gelu_new""#),
            Const("scale_attn_weights", "true"),
            Const("scale_attn_by_inverse_layer_idx", "false"),
            Const("reorder_and_upcast_attn", "false"),
            Const("add_cross_attention", "false"),
        ],
    },
    ArchLayout {
        arch: "bert",
        hf_class: "BertModel",
        model_type: "bert",
        tensors: &[
            t("token_embd.weight", "embeddings.word_embeddings.weight"),
            t("position_embd.weight", "embeddings.position_embeddings.weight"),
            t("token_types.weight", "embeddings.token_type_embeddings.weight"),
            t("token_embd_norm.weight", "embeddings.LayerNorm.weight"),
            t("token_embd_norm.bias", "embeddings.LayerNorm.bias"),
            t(
                "blk.{N}.attn_q.weight",
                "encoder.layer.{N}.attention.self.query.weight",
            ),
            t("blk.{N}.attn_q.bias", "encoder.layer.{N}.attention.self.query.bias"),
            t("blk.{N}.attn_k.weight", "encoder.layer.{N}.attention.self.key.weight"),
            t("blk.{N}.attn_k.bias", "encoder.layer.{N}.attention.self.key.bias"),
            t(
                "blk.{N}.attn_v.weight",
                "encoder.layer.{N}.attention.self.value.weight",
            ),
            t("blk.{N}.attn_v.bias", "encoder.layer.{N}.attention.self.value.bias"),
            t(
                "blk.{N}.attn_output.weight",
                "encoder.layer.{N}.attention.output.dense.weight",
            ),
            t(
                "blk.{N}.attn_output.bias",
                "encoder.layer.{N}.attention.output.dense.bias",
            ),
            t(
                "blk.{N}.attn_output_norm.weight",
                "encoder.layer.{N}.attention.output.LayerNorm.weight",
            ),
            t(
                "blk.{N}.attn_output_norm.bias",
                "encoder.layer.{N}.attention.output.LayerNorm.bias",
            ),
            t(
                "blk.{N}.ffn_up.weight",
                "encoder.layer.{N}.intermediate.dense.weight",
            ),
            t("blk.{N}.ffn_up.bias", "encoder.layer.{N}.intermediate.dense.bias"),
            t("blk.{N}.ffn_down.weight", "encoder.layer.{N}.output.dense.weight"),
            t("blk.{N}.ffn_down.bias", "encoder.layer.{N}.output.dense.bias"),
            t(
                "blk.{N}.layer_output_norm.weight",
                "encoder.layer.{N}.output.LayerNorm.weight",
            ),
            t(
                "blk.{N}.layer_output_norm.bias",
                "encoder.layer.{N}.output.LayerNorm.bias",
            ),
        ],
        config: &[
            U32("block_count", "num_hidden_layers"),
            U32("context_length", "max_position_embeddings"),
            U32("embedding_length", "hidden_size"),
            U32("feed_forward_length", "intermediate_size"),
            U32("attention.head_count", "num_attention_heads"),
            F32("attention.layer_norm_epsilon", "layer_norm_eps"),
            U32("tokenizer.ggml.token_type_count", "type_vocab_size"),
            MetaBool("attention.causal", false),
            U32("pooling_type", "lockstep_pooling_type"),
            Ignored(
                "vocab_size",
                "the vocabulary is token_embd's rows (config.json vocab_size)",
            ),
            Const("hidden_act", r#""gelu_pytorch_tanh""#),
            Const("position_embedding_type", r#""absolute""#),
        ],
    },
    ArchLayout {
        arch: "whisper",
        hf_class: "WhisperForConditionalGeneration",
        model_type: "whisper",
        tensors: &[
            tx("enc.conv1.weight", "model.encoder.conv1.weight", Flatten(3)),
            t("enc.conv1.bias", "model.encoder.conv1.bias"),
            tx("enc.conv2.weight", "model.encoder.conv2.weight", Flatten(3)),
            t("enc.conv2.bias", "model.encoder.conv2.bias"),
            t("enc.position_embd.weight", "model.encoder.embed_positions.weight"),
            t("enc.blk.{N}.attn_norm.weight", "model.encoder.layers.{N}.self_attn_layer_norm.weight"),
            t("enc.blk.{N}.attn_norm.bias", "model.encoder.layers.{N}.self_attn_layer_norm.bias"),
            t("enc.blk.{N}.attn_q.weight", "model.encoder.layers.{N}.self_attn.q_proj.weight"),
            t("enc.blk.{N}.attn_q.bias", "model.encoder.layers.{N}.self_attn.q_proj.bias"),
            t("enc.blk.{N}.attn_k.weight", "model.encoder.layers.{N}.self_attn.k_proj.weight"),
            t("enc.blk.{N}.attn_v.weight", "model.encoder.layers.{N}.self_attn.v_proj.weight"),
            t("enc.blk.{N}.attn_v.bias", "model.encoder.layers.{N}.self_attn.v_proj.bias"),
            t("enc.blk.{N}.attn_output.weight", "model.encoder.layers.{N}.self_attn.out_proj.weight"),
            t("enc.blk.{N}.attn_output.bias", "model.encoder.layers.{N}.self_attn.out_proj.bias"),
            t("enc.blk.{N}.ffn_norm.weight", "model.encoder.layers.{N}.final_layer_norm.weight"),
            t("enc.blk.{N}.ffn_norm.bias", "model.encoder.layers.{N}.final_layer_norm.bias"),
            t("enc.blk.{N}.ffn_up.weight", "model.encoder.layers.{N}.fc1.weight"),
            t("enc.blk.{N}.ffn_up.bias", "model.encoder.layers.{N}.fc1.bias"),
            t("enc.blk.{N}.ffn_down.weight", "model.encoder.layers.{N}.fc2.weight"),
            t("enc.blk.{N}.ffn_down.bias", "model.encoder.layers.{N}.fc2.bias"),
            t("enc.output_norm.weight", "model.encoder.layer_norm.weight"),
            t("enc.output_norm.bias", "model.encoder.layer_norm.bias"),
            t("token_embd.weight", "model.decoder.embed_tokens.weight"),
            t("position_embd.weight", "model.decoder.embed_positions.weight"),
            opt("output.weight", "proj_out.weight"),
            t("blk.{N}.attn_norm.weight", "model.decoder.layers.{N}.self_attn_layer_norm.weight"),
            t("blk.{N}.attn_norm.bias", "model.decoder.layers.{N}.self_attn_layer_norm.bias"),
            t("blk.{N}.attn_q.weight", "model.decoder.layers.{N}.self_attn.q_proj.weight"),
            t("blk.{N}.attn_q.bias", "model.decoder.layers.{N}.self_attn.q_proj.bias"),
            t("blk.{N}.attn_k.weight", "model.decoder.layers.{N}.self_attn.k_proj.weight"),
            t("blk.{N}.attn_v.weight", "model.decoder.layers.{N}.self_attn.v_proj.weight"),
            t("blk.{N}.attn_v.bias", "model.decoder.layers.{N}.self_attn.v_proj.bias"),
            t("blk.{N}.attn_output.weight", "model.decoder.layers.{N}.self_attn.out_proj.weight"),
            t("blk.{N}.attn_output.bias", "model.decoder.layers.{N}.self_attn.out_proj.bias"),
            t("blk.{N}.cross_attn_norm.weight", "model.decoder.layers.{N}.encoder_attn_layer_norm.weight"),
            t("blk.{N}.cross_attn_norm.bias", "model.decoder.layers.{N}.encoder_attn_layer_norm.bias"),
            t("blk.{N}.cross_attn_q.weight", "model.decoder.layers.{N}.encoder_attn.q_proj.weight"),
            t("blk.{N}.cross_attn_q.bias", "model.decoder.layers.{N}.encoder_attn.q_proj.bias"),
            t("blk.{N}.cross_attn_k.weight", "model.decoder.layers.{N}.encoder_attn.k_proj.weight"),
            t("blk.{N}.cross_attn_v.weight", "model.decoder.layers.{N}.encoder_attn.v_proj.weight"),
            t("blk.{N}.cross_attn_v.bias", "model.decoder.layers.{N}.encoder_attn.v_proj.bias"),
            t("blk.{N}.cross_attn_output.weight", "model.decoder.layers.{N}.encoder_attn.out_proj.weight"),
            t("blk.{N}.cross_attn_output.bias", "model.decoder.layers.{N}.encoder_attn.out_proj.bias"),
            t("blk.{N}.ffn_norm.weight", "model.decoder.layers.{N}.final_layer_norm.weight"),
            t("blk.{N}.ffn_norm.bias", "model.decoder.layers.{N}.final_layer_norm.bias"),
            t("blk.{N}.ffn_up.weight", "model.decoder.layers.{N}.fc1.weight"),
            t("blk.{N}.ffn_up.bias", "model.decoder.layers.{N}.fc1.bias"),
            t("blk.{N}.ffn_down.weight", "model.decoder.layers.{N}.fc2.weight"),
            t("blk.{N}.ffn_down.bias", "model.decoder.layers.{N}.fc2.bias"),
            t("output_norm.weight", "model.decoder.layer_norm.weight"),
            t("output_norm.bias", "model.decoder.layer_norm.bias"),
        ],
        config: &[
            U32("block_count", "decoder_layers"),
            U32("context_length", "max_target_positions"),
            U32("embedding_length", "d_model"),
            U32("feed_forward_length", "decoder_ffn_dim"),
            U32("attention.head_count", "decoder_attention_heads"),
            U32("encoder.block_count", "encoder_layers"),
            U32("encoder.context_length", "max_source_positions"),
            U32("encoder.feed_forward_length", "encoder_ffn_dim"),
            U32("encoder.attention.head_count", "encoder_attention_heads"),
            U32("n_mels", "num_mel_bins"),
            MetaF32("attention.layer_norm_epsilon", 1e-5),
            Ignored(
                "vocab_size",
                "the vocabulary is token_embd's rows (config.json vocab_size)",
            ),
            Const("activation_function", r#""gelu""#),
            Const("scale_embedding", "false"),
        ],
    },
];

/// The layout of GGUF architecture `arch`, `None` if there is none.
pub fn layout_of_arch(arch: &str) -> Option<&'static ArchLayout> {
    LAYOUTS.iter().find(|l| l.arch == arch)
}

/// The layout whose `model_type` is `model_type`, `None` if there is none.
pub fn layout_of_model_type(model_type: &str) -> Option<&'static ArchLayout> {
    LAYOUTS.iter().find(|l| l.model_type == model_type)
}

/// A name with `{N}` replaced by `layer`.
pub fn with_layer(pattern: &str, layer: usize) -> String {
    pattern.replace("{N}", &layer.to_string())
}

/// Match `name` against `pattern` (`{N}` = a decimal layer number): `Some(layer)` (`Some(None)` for a
/// pattern without `{N}`), `None` if it does not match.
pub fn match_name(pattern: &str, name: &str) -> Option<Option<usize>> {
    match pattern.split_once("{N}") {
        None => (pattern == name).then_some(None),
        Some((pre, post)) => {
            let mid = name.strip_prefix(pre)?.strip_suffix(post)?;
            if mid.is_empty() || !mid.bytes().all(|b| b.is_ascii_digit()) || mid.len() > 6 {
                return None;
            }
            Some(Some(mid.parse().ok()?))
        }
    }
}

impl ArchLayout {
    /// The rule and layer of GGUF tensor `name`, `None` if the layout has no place for it.
    pub fn by_gguf(&self, name: &str) -> Option<(&'static TensorRule, Option<usize>)> {
        let tensors: &'static [TensorRule] = self.tensors;
        tensors
            .iter()
            .find_map(|r| match_name(r.gguf, name).map(|l| (r, l)))
    }

    /// The rule and layer of HF tensor `name`, `None` if the layout has no place for it.
    pub fn by_hf(&self, name: &str) -> Option<(&'static TensorRule, Option<usize>)> {
        let tensors: &'static [TensorRule] = self.tensors;
        tensors
            .iter()
            .find_map(|r| match_name(r.hf, name).map(|l| (r, l)))
    }
}

/// The GGUF row order of a llama-family Q/K matrix from the HF one: per head of `head_dim` rows, HF row
/// `s·D/2 + i` (half `s`, pair `i`) goes to GGUF row `2i + s` (`LlamaModel.permute`). Returns, for each
/// GGUF row, the HF row it holds.
pub fn rope_permutation(n_rows: usize, n_head: usize) -> Option<Vec<usize>> {
    if n_head == 0 || !n_rows.is_multiple_of(n_head) || !(n_rows / n_head).is_multiple_of(2) {
        return None;
    }
    let d = n_rows / n_head;
    Some(
        (0..n_rows)
            .map(|g| {
                let (h, r) = (g / d, g % d);
                let (i, s) = (r / 2, r % 2);
                h * d + s * (d / 2) + i
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_both_ways_and_are_unique() {
        for l in LAYOUTS {
            for r in l.tensors {
                assert_eq!(
                    l.by_gguf(&with_layer(r.gguf, 3)).unwrap().0.hf,
                    r.hf,
                    "{}",
                    l.arch
                );
                assert_eq!(l.by_hf(&with_layer(r.hf, 3)).unwrap().0.gguf, r.gguf);
            }
            assert!(layout_of_model_type(l.model_type).is_some());
        }
        assert_eq!(match_name("blk.{N}.x", "blk.12.x"), Some(Some(12)));
        assert_eq!(match_name("blk.{N}.x", "blk..x"), None);
        assert_eq!(match_name("blk.{N}.x", "blk.1a.x"), None);
    }

    #[test]
    fn rope_permutation_is_llama_permute() {
        // one head of 4 rows: HF [a0 a1 | b0 b1] -> GGUF [a0 b0 a1 b1]
        assert_eq!(rope_permutation(4, 1).unwrap(), vec![0, 2, 1, 3]);
        assert_eq!(
            rope_permutation(8, 2).unwrap(),
            vec![0, 2, 1, 3, 4, 6, 5, 7]
        );
        assert!(rope_permutation(6, 2).is_none());
    }
}
