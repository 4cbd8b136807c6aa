//! `general.architecture = "bert"` (BERT, MiniLM, BGE, ...: encoder-only sentence embedders) as llama.cpp
//! builds it (src/models/bert.cpp; HF `BertModel`, transformers/models/bert/modeling_bert.py):
//!
//! ```text
//! x = LN(token_embd[tokens] + token_types[0] + position_embd[positions])       (token_embd_norm)
//! for each block:  x = LN(x + Wo · attn(x·Wq + bq, x·Wk + bk, x·Wv + bv) + bo)   (attn_output_norm)
//!                  x = LN(x + W_down · gelu(x·W_up + b_up) + b_down)           (layer_output_norm)
//! pooled = mean_t x[t]  |  x[0] (CLS)  |  x[n−1] (last)                        (bert.pooling_type)
//! ```
//!
//! Attention is bidirectional (`bert.attention.causal = false`: llama.cpp's no-cache attention input, every
//! token sees the whole sequence), 1/√head_dim, no RoPE, no KV cache; LayerNorm epsilon
//! `bert.attention.layer_norm_epsilon`; the GELU is ggml's tanh approximation (`LLM_FFN_GELU`), whatever
//! the original model's `hidden_act` was. Token types are all 0, as llama.cpp feeds them. The output is
//! the pooled embedding, not normalised (llama.cpp's `llama_get_embeddings_seq`; normalising is the
//! caller's choice). Not supported: `attention.causal = true`, pooling NONE and RANK (a classifier head),
//! the fused-QKV / Q-K-norm variants. Wiring only: the blocks are [`super::encoder`].

use crate::gguf::GgufFile;
use crate::models::encoder::{Encoder, EncoderWiring, Pooling};
use crate::models::hparams::{DecoderDims, Meta};
use crate::{Error, Result};

/// Build a BERT [`Encoder`] from the file (dims from `bert.*` metadata).
///
/// Errors: as [`DecoderDims::read`] and [`Encoder::load`]; a causal BERT file, a missing or unsupported
/// `bert.pooling_type` ([`Pooling::from_gguf`]).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Encoder)> {
    let m = Meta::new(g, "bert");
    let c = DecoderDims::read_eps(&m, "attention.layer_norm_epsilon")?;
    if g.get("bert.attention.causal").is_some() && g.get_bool("bert.attention.causal")? {
        return Err(Error::Unsupported(format!(
            "{}: bert.attention.causal = true (a causal encoder) is not implemented",
            g.path().display()
        )));
    }
    // llama.cpp's default when the key is missing is NONE (per-token embeddings), which has no pooled output
    let pooling = Pooling::from_gguf(m.opt_usize("pooling_type")?.unwrap_or(0), g.path())?;
    let encoder = Encoder::load(
        g,
        &c,
        EncoderWiring {
            norm_eps: c.norm_eps,
            pooling,
        },
    )?;
    Ok((c, encoder))
}
