//! `general.architecture = "stablelm"` (StableLM-3B-4E1T, StableLM 2 1.6B/Zephyr) as llama.cpp builds it
//! (src/models/stablelm.cpp):
//!
//! ```text
//! x = token_embd[tokens]
//! for each block:  h = LayerNorm(x)·w_attn_norm + b_attn_norm
//!                  x = x + Wo · attn(RoPE_neox(h·Wq (+ bq)), RoPE_neox(h·Wk (+ bk)), h·Wv (+ bv))
//!                  h = LayerNorm(x)·w_ffn_norm + b_ffn_norm
//!                  x = x + W_down · (silu(h·W_gate) ⊙ h·W_up)
//! logits = (LayerNorm(x)·w_output_norm + b_output_norm) · W_outᵀ
//! ```
//!
//! Partial rotary: only the first `rope.dimension_count` (25% of head_dim) dimensions of each head rotate
//! (NeoX pairs within them; `theta_scale = base^(−2/rope_dim)`), the rest pass through. LayerNorm epsilon
//! `stablelm.attention.layer_norm_epsilon`. Q/K/V biases (StableLM 2) when the file has them; no output
//! projection bias. Not supported: StableLM 2 12B's per-head Q/K LayerNorms and its parallel residual
//! (no `ffn_norm`): such a file fails to load (a missing `ffn_norm`, refused Q/K norms). Wiring only.

use crate::gguf::GgufFile;
use crate::models::blocks::{Decoder, GluAct, RopeKind};
use crate::models::hparams::{DecoderDims, Meta};
use crate::{Error, Result};

/// Build a StableLM [`Decoder`] from the file (dims from `stablelm.*` metadata).
///
/// Errors: as [`DecoderDims::read`] and [`Decoder::load`]; per-head Q/K norms are [`Error::Unsupported`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let m = Meta::new(g, "stablelm");
    let c = DecoderDims::read_eps(&m, "attention.layer_norm_epsilon")?;
    if g.tensor("blk.0.attn_q_norm.weight").is_ok() {
        return Err(Error::Unsupported(format!(
            "{}: stablelm with per-head Q/K LayerNorms (StableLM 2 12B) is not implemented",
            g.path().display()
        )));
    }
    let decoder = super::starcoder2::wire(g, &c, RopeKind::Neox, GluAct::Silu, true)?;
    Ok((c, decoder))
}
