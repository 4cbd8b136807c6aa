//! `general.architecture = "qwen2"` (Qwen2, Qwen2.5, Qwen2.5-Coder) as llama.cpp builds it
//! (src/models/qwen2.cpp, `llm_build_qwen2`): the Llama block structure with
//! - biases on the Q, K and V projections (`attn_{q,k,v}.bias`, added right after each matmul),
//! - NeoX RoPE (`LLAMA_ROPE_TYPE_NEOX`: half-split pairs, HF `rotate_half`),
//! - a separate `output.weight` (used when present; the 0.5B/1.5B files have one).
//!
//! Wiring only: see [`super::llama::wire`] and [`super::blocks`].

use crate::gguf::GgufFile;
use crate::models::blocks::{AttnTensors, Decoder, RopeKind};
use crate::models::hparams::{DecoderDims, Meta};
use crate::Result;

/// Build a Qwen2 [`Decoder`] from the file (dims from `qwen2.*` metadata).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let c = DecoderDims::read(&Meta::new(g, "qwen2"))?;
    let tensors = AttnTensors {
        bias: true,
        ..AttnTensors::default()
    };
    let decoder = super::llama::wire(g, &c, RopeKind::Neox, tensors)?;
    Ok((c, decoder))
}
