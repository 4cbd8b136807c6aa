//! `general.architecture = "phi3"` (Phi-3 mini/medium, Phi-4) as llama.cpp builds it (src/models/phi3.cpp,
//! `llama_model_phi3`; HF `Phi3ForCausalLM`, transformers/models/phi3/modeling_phi3.py):
//!
//! ```text
//! x = token_embd[tokens]
//! for each block:
//!     h = RMSNorm(x)·w_attn_norm
//!     [q | k | v] = h·W_qkvᵀ                   (one fused matmul, split by columns: build_qkv)
//!     q, k = RoPE_neox(q), RoPE_neox(k);  q = q / √head_dim
//!     x = x + Wo · softmax(q·kᵀ + mask) · v     (kq_scale = 1)
//!     h = RMSNorm(x)·w_ffn_norm
//!     [g | u] = h·W_upᵀ                        (one fused matmul of 2·d_ff rows)
//!     x = x + W_down · (silu(g) ⊙ u)            (ggml_swiglu: the first half is the gate)
//! logits = RMSNorm(x)·w_output_norm · W_outᵀ   (`output.weight`, else the tied token_embd)
//! ```
//!
//! What llama.cpp does beyond the file: `attn_qkv` is optional (`create_tensor_qkv(.., TENSOR_NOT_REQUIRED)`:
//! the separate `attn_{q,k,v}` otherwise), which [`super::blocks::QkvWeights::load`] decides by what the
//! file has, as it decides the fused FFN by the absence of `ffn_gate`; `attention.sliding_window`, which
//! the converter writes, is ignored — "Phi SWA is currently disabled" (`load_arch_hparams` sets
//! `LLAMA_SWA_TYPE_NONE`), so every layer attends to the whole causal prefix; no biases. The LongRoPE
//! factors of the 128k models (`rope_factors_long/short.weight`) are refused.
//!
//! Wiring only: the blocks are [`super::blocks`].

use crate::gguf::GgufFile;
use crate::models::blocks::{
    AttnOptions, AttnTensors, Decoder, GluAct, NormKind, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::ops::AttnShape;
use crate::{Error, Result};

/// The attention options of every Phi-3 block: NeoX RoPE, Q scaled by 1/√head_dim after RoPE and
/// `kq_scale = 1` (phi3.cpp: `ggml_scale(Qcur, 1/√n_embd_head)`, `build_attn(.., 1.0f, il)`), no window.
pub fn attn_options(c: &DecoderDims) -> AttnOptions {
    AttnOptions {
        shape: AttnShape {
            kq_scale: 1.0,
            ..AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim)
        },
        rope: Rope {
            kind: RopeKind::Neox,
            base: c.rope_base,
            dim: c.rope_dim,
        },
        q_scale: Some(1.0 / (c.head_dim as f32).sqrt()),
        tensors: AttnTensors::default(),
        norm_eps: c.norm_eps,
    }
}

/// Build a Phi-3 [`Decoder`] from the file (dims from `phi3.*` metadata).
///
/// Errors: as [`DecoderDims::read`] and [`crate::models::blocks::Decoder::load`]; LongRoPE factor tensors
/// are [`Error::Unsupported`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let c = DecoderDims::read(&Meta::new(g, "phi3"))?;
    for t in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if g.tensor(t).is_ok() {
            return Err(Error::Unsupported(format!(
                "{}: {t} (LongRoPE frequency factors) is not implemented",
                g.path().display()
            )));
        }
    }
    let opts = attn_options(&c);
    let wiring = Wiring {
        embed_scale: None,
        post_norms: false,
        act: GluAct::Silu,
        attn: &|_| opts,
        final_softcap: None,
        // gated: the gate is the first half of the fused `ffn_up` (Ffn::load finds no `ffn_gate`)
        gated_ffn: true,
        norm: NormKind::Rms,
    };
    let decoder = Decoder::load(g, &c, &wiring)?;
    Ok((c, decoder))
}
