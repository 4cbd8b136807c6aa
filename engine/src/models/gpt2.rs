//! `general.architecture = "gpt2"` (GPT-2 small/medium/large/XL) — Radford et al. 2019, "Language Models
//! are Unsupervised Multitask Learners" — as llama.cpp builds it (src/models/gpt2.cpp; HF `GPT2LMHeadModel`,
//! transformers/models/gpt2/modeling_gpt2.py):
//!
//! ```text
//! x = token_embd[tokens] + position_embd[positions]          (learned absolute positions, node "inpL")
//! for each block:  h = LayerNorm(x)·w_attn_norm + b_attn_norm
//!                  [q | k | v] = h·W_qkvᵀ + b_qkv              (one fused matmul, then split: build_qkv)
//!                  x = x + (Wo · attn(q, k, v) + bo)           (no RoPE; kq_scale 1/√head_dim)
//!                  h = LayerNorm(x)·w_ffn_norm + b_ffn_norm
//!                  x = x + W_down · gelu(h·W_up + b_up) + b_down
//! logits = (LayerNorm(x)·w_output_norm + b_output_norm) · W_outᵀ   (W_out = token_embd when tied)
//! ```
//!
//! LayerNorm epsilon `gpt2.attention.layer_norm_epsilon`; the FFN is not gated (`LLM_FFN_GELU` +
//! `LLM_FFN_SEQ`, the tanh GELU — HF's `gelu_new`). A position past `position_embd`'s rows (the training
//! context) is an error. Wiring only: the blocks are [`super::blocks`], the LayerNorm wiring is
//! [`super::starcoder2::wire`]'s.

use crate::gguf::GgufFile;
use crate::models::blocks::{Decoder, GluAct, RopeKind};
use crate::models::hparams::{DecoderDims, Meta};
use crate::{Error, Result};

/// Build a GPT-2 [`Decoder`] from the file (dims from `gpt2.*` metadata).
///
/// Errors: as [`DecoderDims::read`] and [`Decoder::load`]; a file without `position_embd.weight`
/// ([`Error::Model`]).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let m = Meta::new(g, "gpt2");
    let c = DecoderDims::read_eps(&m, "attention.layer_norm_epsilon")?;
    let decoder = super::starcoder2::wire(g, &c, RopeKind::None, GluAct::GeluTanh, false)?;
    if decoder.embed.positions.is_none() {
        return Err(Error::Model {
            path: g.path().to_path_buf(),
            what: "gpt2 without position_embd.weight (its learned absolute positions)".into(),
        });
    }
    Ok((c, decoder))
}
