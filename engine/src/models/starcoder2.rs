//! `general.architecture = "starcoder2"` (StarCoder2 3B/7B/15B, Granite code 20B/34B) — Lozhkov et al.
//! 2024, as llama.cpp builds it (src/models/starcoder2.cpp):
//!
//! ```text
//! x = token_embd[tokens]
//! for each block:  h = LayerNorm(x)·w_attn_norm + b_attn_norm
//!                  x = x + (Wo · attn(RoPE_neox(h·Wq + bq), RoPE_neox(h·Wk + bk), h·Wv + bv) + bo)
//!                  h = LayerNorm(x)·w_ffn_norm + b_ffn_norm
//!                  x = x + W_down · gelu(h·W_up + b_up) + b_down
//! logits = (LayerNorm(x)·w_output_norm + b_output_norm) · W_outᵀ   (W_out = token_embd when tied)
//! ```
//!
//! LayerNorm epsilon `starcoder2.attention.layer_norm_epsilon`; NeoX RoPE over the whole head
//! (`n_rot == head_dim` is asserted by llama.cpp); the FFN is not gated (`LLM_FFN_GELU` + `LLM_FFN_SEQ`, the
//! tanh GELU). Every bias is taken when the file has it. Wiring only: the blocks are [`super::blocks`].

use crate::gguf::GgufFile;
use crate::models::blocks::{
    AttnOptions, AttnTensors, Decoder, GluAct, NormKind, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::ops::AttnShape;
use crate::Result;

/// Build a StarCoder2 [`Decoder`] from the file (dims from `starcoder2.*` metadata).
///
/// Errors: as [`DecoderDims::read`] and [`Decoder::load`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let m = Meta::new(g, "starcoder2");
    let c = DecoderDims::read_eps(&m, "attention.layer_norm_epsilon")?;
    let decoder = wire(g, &c, RopeKind::Neox, GluAct::GeluTanh, false)?;
    Ok((c, decoder))
}

/// The LayerNorm wiring of StarCoder2, StableLM and GPT-2: plain causal attention with 1/√head_dim, RoPE
/// of `rope_kind` over `rope_dim` (none for GPT-2's learned positions), Q/K/V biases when block 0 has them,
/// no post-norms; the FFN gated (`act`) or not.
pub(crate) fn wire(
    g: &GgufFile,
    c: &DecoderDims,
    rope_kind: RopeKind,
    act: GluAct,
    gated: bool,
) -> Result<Decoder> {
    let opts = AttnOptions {
        shape: AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim),
        rope: Rope {
            kind: rope_kind,
            base: c.rope_base,
            dim: c.rope_dim,
        },
        q_scale: None,
        tensors: AttnTensors {
            bias: g.tensor("blk.0.attn_q.bias").is_ok() || g.tensor("blk.0.attn_qkv.bias").is_ok(),
            ..AttnTensors::default()
        },
        norm_eps: c.norm_eps,
    };
    let wiring = Wiring {
        embed_scale: None,
        post_norms: false,
        act,
        gated_ffn: gated,
        norm: NormKind::Layer,
        attn: &|_| opts,
        final_softcap: None,
    };
    Decoder::load(g, c, &wiring)
}
