//! `general.architecture = "qwen3"` (Qwen3 dense models) as llama.cpp builds it (src/models/qwen3.cpp,
//! `llama_model_qwen3::graph`): the Llama block structure with
//! - per-head RMSNorms of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`; `Qcur_normed`, `Kcur_normed`),
//! - no Q/K/V biases (Qwen2 had them),
//! - NeoX RoPE (`LLAMA_ROPE_TYPE_NEOX`), `kq_scale = 1/√head_dim`,
//! - `head_dim` from `attention.key_length` (it need not be d_model / n_head),
//! - `output.weight` when the file has one, else the tied `token_embd`.
//!
//! HF: `Qwen3Attention` (transformers/models/qwen3/modeling_qwen3.py). Wiring only: see
//! [`super::llama::wire`] and [`super::blocks`].

use crate::gguf::GgufFile;
use crate::models::blocks::{AttnTensors, Decoder, RopeKind};
use crate::models::hparams::{DecoderDims, Meta};
use crate::Result;

/// Build a Qwen3 [`Decoder`] from the file (dims from `qwen3.*` metadata).
///
/// Errors: as [`DecoderDims::read`] and [`Decoder::load`] (a missing Q/K norm names its tensor).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let c = DecoderDims::read(&Meta::new(g, "qwen3"))?;
    let tensors = AttnTensors {
        bias: false,
        qk_norm: true,
        ..AttnTensors::default()
    };
    let decoder = super::llama::wire(g, &c, RopeKind::Neox, tensors)?;
    Ok((c, decoder))
}
