//! `general.architecture = "llama"` (Llama 1/2/3, SmolLM, Mistral without sliding window) — Touvron et al.
//! 2023, as llama.cpp builds it (src/models/llama.cpp, `llm_build_llama`):
//!
//! ```text
//! x = token_embd[tokens]
//! for each block:  x = x + Wo · attn(RoPE_norm(h·Wq), RoPE_norm(h·Wk), h·Wv),  h = RMSNorm(x)·w_attn_norm
//!                  x = x + W_down · (silu(h·W_gate) ⊙ h·W_up),                 h = RMSNorm(x)·w_ffn_norm
//! logits = RMSNorm(x)·w_output_norm · W_outᵀ   (W_out = token_embd when the file ties them)
//! ```
//!
//! Wiring only: the blocks are [`super::blocks`]. RoPE is the interleaved NORM layout (the converter
//! permutes Q and K, convert_hf_to_gguf.py `LlamaModel.permute`).

use crate::gguf::GgufFile;
use crate::models::blocks::{
    Attention, AttnOptions, AttnTensors, Decoder, DecoderLayer, Embedding, Ffn, GluAct, OutputHead,
    RmsNorm, Rope, RopeKind,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::models::weights::Weight;
use crate::ops::AttnShape;
use crate::Result;

/// Build a Llama [`Decoder`] from the file (dims from `llama.*` metadata).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let c = DecoderDims::read(&Meta::new(g, "llama"))?;
    let decoder = wire(g, &c, RopeKind::Norm, AttnTensors::default())?;
    Ok((c, decoder))
}

/// The Llama block structure, shared by the architectures that differ from it only in their attention
/// tensors and RoPE layout (Qwen2: biases and NeoX).
pub(crate) fn wire(
    g: &GgufFile,
    c: &DecoderDims,
    rope_kind: RopeKind,
    tensors: AttnTensors,
) -> Result<Decoder> {
    let d = c.d_model;
    let embed = Embedding {
        weight: Weight::load(g, "token_embd.weight", None, Some(d))?,
        scale: None,
    };
    let opts = AttnOptions {
        shape: AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim),
        rope: Rope {
            kind: rope_kind,
            base: c.rope_base,
            dim: c.rope_dim,
        },
        q_scale: None,
        tensors,
        norm_eps: c.norm_eps,
    };
    let layers = (0..c.n_layer)
        .map(|l| {
            let norm = |t: &str| RmsNorm::load(g, &format!("blk.{l}.{t}.weight"), d, c.norm_eps);
            Ok(DecoderLayer {
                layer: l,
                attn_norm: norm("attn_norm")?,
                attn: Attention::load(g, l, d, opts)?,
                attn_post_norm: None,
                ffn_norm: norm("ffn_norm")?,
                ffn: Ffn::load(g, l, d, c.d_ff, GluAct::Silu)?,
                ffn_post_norm: None,
            })
        })
        .collect::<Result<_>>()?;
    let head = OutputHead::load(g, d, c.n_vocab, c.norm_eps, &embed.weight)?;
    Ok(Decoder {
        embed,
        layers,
        head,
    })
}
