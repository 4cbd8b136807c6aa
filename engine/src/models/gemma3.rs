//! `general.architecture = "gemma3"` (Gemma 3 text models) as llama.cpp builds it (src/models/gemma3-iswa.cpp,
//! `llm_build_gemma3_iswa`; hyperparameters in src/llama-model.cpp, `LLM_ARCH_GEMMA3`):
//!
//! ```text
//! x = token_embd[tokens] · √d_model                                   (inp_scaled)
//! for each block l:
//!     h = RMSNorm(x)·w_attn_norm
//!     q, k, v = h·Wq, h·Wk, h·Wv;  q, k = RMSNorm_per_head(q, k)      (Qcur_normed, Kcur_normed)
//!     q, k = RoPE_neox(q, k; base_l);  q = q · f_attention_scale
//!     x = x + RMSNorm(Wo · attn(q, k, v; kq_scale = 1, window_l))·w_attn_post_norm      (sa_out)
//!     x = x + RMSNorm(W_down · (gelu_tanh(h·W_gate) ⊙ h·W_up))·w_ffn_post_norm,  h = RMSNorm(x)·w_ffn_norm
//! logits = RMSNorm(x)·w_output_norm · token_embdᵀ
//! ```
//!
//! What the file does not say and llama.cpp supplies: every 6th layer (`l % 6 == 5`) is global, the others
//! local with a sliding window of `attention.sliding_window` positions (`hparams.set_swa_pattern(6)`,
//! `LLAMA_SWA_TYPE_STANDARD`); local layers use RoPE base 10000 (`rope_freq_base_train_swa`), global layers
//! `rope.freq_base`; `f_attention_scale = 1/√head_dim` (1/√(d_model/n_head) for the 27B only). Norm weights
//! are used as stored: the converter (convert_hf_to_gguf.py `Gemma3Model.modify_tensors`) already added HF's
//! `1 +`. No final logit soft-capping in Gemma 3.
//!
//! Wiring only: the blocks are [`super::blocks`].

use crate::gguf::GgufFile;
use crate::models::blocks::{
    Attention, AttnOptions, AttnTensors, Decoder, DecoderLayer, Embedding, Ffn, GluAct, OutputHead,
    RmsNorm, Rope, RopeKind,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::models::weights::Weight;
use crate::ops::AttnShape;
use crate::{Error, Result};

/// Local/global period of the layers (`hparams.set_swa_pattern(6)`): layer `l` is global iff
/// `l % SWA_PATTERN == SWA_PATTERN - 1`.
pub const SWA_PATTERN: usize = 6;

/// RoPE base of the sliding-window layers (`hparams.rope_freq_base_train_swa = 10000.0f`).
pub const ROPE_BASE_LOCAL: f32 = 10000.0;

/// Build a Gemma 3 [`Decoder`] from the file (dims from `gemma3.*` metadata).
///
/// Errors: as [`DecoderDims::read`]; a RoPE scaling factor other than 1 (used by the larger Gemma 3 models,
/// not implemented here) is [`Error::Unsupported`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let m = Meta::new(g, "gemma3");
    let c = DecoderDims::read(&m)?;
    if let Some(f) = m.opt_f32("rope.scaling.factor")? {
        if f != 1.0 {
            return Err(Error::Unsupported(format!(
                "{}: gemma3.rope.scaling.factor = {f} (RoPE scaling) is not implemented",
                g.path().display()
            )));
        }
    }
    let window = m.opt_usize("attention.sliding_window")?.filter(|&w| w > 0);
    let d = c.d_model;
    let embed = Embedding {
        weight: Weight::load(g, "token_embd.weight", None, Some(d))?,
        scale: Some((d as f32).sqrt()),
    };
    let q_scale = 1.0 / (c.head_dim as f32).sqrt();
    let tensors = AttnTensors {
        bias: false,
        qk_norm: true,
    };
    let layers = (0..c.n_layer)
        .map(|l| {
            // without a window in the file every layer is global (LLAMA_SWA_TYPE_NONE)
            let local = window.is_some() && l % SWA_PATTERN < SWA_PATTERN - 1;
            let rope = Rope {
                kind: RopeKind::Neox,
                base: if local { ROPE_BASE_LOCAL } else { c.rope_base },
                dim: c.rope_dim,
            };
            let shape = AttnShape {
                kq_scale: 1.0,
                window: if local { window } else { None },
                ..AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim)
            };
            let norm = |t: &str| RmsNorm::load(g, &format!("blk.{l}.{t}.weight"), d, c.norm_eps);
            Ok(DecoderLayer {
                layer: l,
                attn_norm: norm("attn_norm")?,
                attn: Attention::load(
                    g,
                    l,
                    d,
                    AttnOptions {
                        shape,
                        rope,
                        q_scale: Some(q_scale),
                        tensors,
                        norm_eps: c.norm_eps,
                    },
                )?,
                attn_post_norm: Some(norm("post_attention_norm")?),
                ffn_norm: norm("ffn_norm")?,
                ffn: Ffn::load(g, l, d, c.d_ff, GluAct::GeluTanh)?,
                ffn_post_norm: Some(norm("post_ffw_norm")?),
            })
        })
        .collect::<Result<_>>()?;
    let head = OutputHead::load(g, d, c.n_vocab, c.norm_eps, &embed.weight)?;
    Ok((
        c,
        Decoder {
            embed,
            layers,
            head,
        },
    ))
}
