//! `general.architecture = "whisper"` (OpenAI Whisper; HF `WhisperForConditionalGeneration`,
//! transformers/models/whisper/modeling_whisper.py; whisper.cpp `whisper_build_graph_encoder` /
//! `_decoder`), an encoder–decoder:
//!
//! ```text
//! encoder:  x = gelu(conv1(mel)); x = gelu(conv2(x))  (k 3, pad 1; stride 1 then 2)   enc.conv1, enc.conv2
//!           x = x + enc.position_embd[0 .. n_frames/2]   (sinusoids as stored)         enc.embed
//!           per block:  x = x + attn(LN(x))     (bidirectional; q, v, out biases; no k bias)
//!                       x = x + fc2(gelu(fc1(LN(x))))                                 enc.blk.N.*
//!           x = LN(x)                                                                  enc.output_norm
//!           per decoder block: cross_k = x·Wkᵀ, cross_v = x·Wvᵀ + bv   (once per input)   blk.N.cross_k/v
//! decoder:  x = token_embd[t] + position_embd[p]                                      embed
//!           per block:  x = x + self_attn(LN(x))   (causal, through the KV cache)     blk.N.attn_*, cross_inp
//!                       x = x + cross_attn(LN(x))  (no mask, cached K/V)              blk.N.cross_*, ffn_inp
//!                       x = x + fc2(gelu(fc1(LN(x))))                                 blk.N.ffn_*, out
//!           logits = LN(x) · token_embdᵀ   (tied)                                     output_norm, logits
//! ```
//!
//! The GELU is the exact (erf) one (`activation_function = "gelu"`); every LayerNorm has PyTorch's
//! default epsilon 1e-5 (`nn.LayerNorm(d_model)`: the HF config has no field for it); attention scales by
//! 1/√head_dim; embeddings are not scaled (`scale_embedding = false`, the only value implemented). Wiring
//! only: the blocks are [`super::blocks`] and [`super::speech`].

use crate::gguf::GgufFile;
use crate::models::blocks::{
    AttnOptions, AttnTensors, CrossAttention, Decoder, DecoderLayer, Ffn, GluAct, NormKind,
    RmsNorm, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::models::speech::{load_stem, AudioEncoder, EncoderDecoder};
use crate::ops::AttnShape;
use crate::Result;

/// LayerNorm epsilon of every Whisper norm (PyTorch's `nn.LayerNorm` default), written as
/// `whisper.attention.layer_norm_epsilon` when an HF directory is opened.
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// Build a Whisper [`EncoderDecoder`] from the file: decoder dims from `whisper.*`, encoder dims from
/// `whisper.encoder.*`, `whisper.n_mels`.
///
/// Errors: missing metadata or tensors, misshapen tensors (naming file and tensor).
pub fn load(g: &GgufFile) -> Result<(DecoderDims, EncoderDecoder)> {
    let m = Meta::new(g, "whisper");
    let c = DecoderDims::read_dims(&m, "attention.layer_norm_epsilon")?;
    let eps = c.norm_eps;
    let opts = |n_head: usize, head_dim: usize| AttnOptions {
        shape: AttnShape::causal(n_head, n_head, head_dim),
        rope: Rope {
            kind: RopeKind::None,
            base: 0.0,
            dim: 0,
        },
        q_scale: None,
        tensors: AttnTensors {
            bias: true,
            no_k_bias: true,
            ..AttnTensors::default()
        },
        norm_eps: eps,
    };
    let dec_opts = opts(c.n_head, c.head_dim);
    let wiring = Wiring {
        embed_scale: None,
        post_norms: false,
        act: GluAct::GeluErf,
        gated_ffn: false,
        norm: NormKind::Layer,
        attn: &|_| dec_opts,
        final_softcap: None,
    };
    let mut decoder = Decoder::load(g, &c, &wiring)?;
    for l in &mut decoder.layers {
        l.cross = Some(CrossAttention::load(
            g,
            l.layer,
            c.d_model,
            dec_opts.shape,
            eps,
        )?);
    }

    // the encoder stack
    let d = c.d_model;
    let n_layer = m.usize("encoder.block_count")?;
    let n_head = m.usize("encoder.attention.head_count")?;
    let d_ff = m.usize("encoder.feed_forward_length")?;
    let n_ctx = m.usize("encoder.context_length")?;
    let n_mels = m.usize("n_mels")?;
    if n_head == 0 || d % n_head != 0 {
        return Err(m.error(format!(
            "encoder.attention.head_count {n_head} does not divide embedding_length {d}"
        )));
    }
    let enc_opts = opts(n_head, d / n_head);
    let norm = |name: &str| RmsNorm::load_kind(g, name, d, eps, NormKind::Layer);
    let layers = (0..n_layer)
        .map(|l| {
            let mut attn = crate::models::blocks::Attention::load_in(g, "enc.", l, d, enc_opts)?;
            attn.bidirectional = true;
            Ok(DecoderLayer {
                layer: l,
                attn_norm: norm(&format!("enc.blk.{l}.attn_norm"))?,
                attn,
                attn_post_norm: None,
                ffn_norm: norm(&format!("enc.blk.{l}.ffn_norm"))?,
                cross: None,
                ffn: Ffn::load_in(g, "enc.", l, (d, d_ff), GluAct::GeluErf, false)?,
                ffn_post_norm: None,
                out_scale: None,
            })
        })
        .collect::<Result<_>>()?;
    let encoder = AudioEncoder {
        stem: load_stem(g, d, n_mels, n_ctx)?,
        layers,
        norm: norm("enc.output_norm")?,
        n_frames: 2 * n_ctx,
    };
    Ok((c, EncoderDecoder { encoder, decoder }))
}
