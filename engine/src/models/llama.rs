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
    AttnOptions, AttnTensors, Decoder, GluAct, NormKind, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::ops::AttnShape;
use crate::Result;

/// Build a Llama [`Decoder`] from the file (dims from `llama.*` metadata).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let c = DecoderDims::read(&Meta::new(g, "llama"))?;
    let decoder = wire(g, &c, RopeKind::Norm, AttnTensors::default())?;
    Ok((c, decoder))
}

/// The Llama wiring, shared by the architectures that differ from it only in their attention tensors and
/// RoPE layout (Qwen2: biases and NeoX): plain causal attention with 1/√head_dim, SwiGLU, no post-norms.
pub(crate) fn wire(
    g: &GgufFile,
    c: &DecoderDims,
    rope_kind: RopeKind,
    tensors: AttnTensors,
) -> Result<Decoder> {
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
    let wiring = Wiring {
        embed_scale: None,
        post_norms: false,
        act: GluAct::Silu,
        gated_ffn: true,
        norm: NormKind::Rms,
        attn: &|_| opts,
        final_softcap: None,
    };
    Decoder::load(g, c, &wiring)
}
