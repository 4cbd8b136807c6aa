//! `general.architecture = "gemma4"` (Gemma 4 dense text models) as llama.cpp builds it (src/models/gemma4.cpp,
//! `llama_model_gemma4`; HF `Gemma4ForCausalLM`, transformers/models/gemma4/modeling_gemma4.py):
//!
//! ```text
//! x = token_embd[tokens] · √d_model                                        (inp_scaled)
//! for each block l (sliding-window or full attention, sliding_window_pattern[l]):
//!     h = RMSNorm(x)·w_attn_norm
//!     q = RMSNorm_per_head(h·Wq)·w_q_norm;  k = RMSNorm_per_head(h·Wk)·w_k_norm
//!     v = RMSNorm_per_head(h·Wv)            (no weight; Wv absent: v = h·Wk, before k's norm)
//!     q, k = RoPE_neox(q, k; base_l, rope_dim_l, freq_factors_l)          (full layers: rope_freqs)
//!     x = x + RMSNorm(Wo · attn(q, k, v; kq_scale = 1, window_l))·w_attn_post_norm    (attn_out)
//!     x = x + RMSNorm(W_down · (gelu_tanh(h·W_gate) ⊙ h·W_up))·w_ffn_post_norm,  h = RMSNorm(x)·w_ffn_norm
//!     x = x · layer_output_scale                                            (out_scaled, when the file has it)
//! logits = cap · tanh((RMSNorm(x)·w_output_norm · W_outᵀ) / cap)          (final_logit_softcapping)
//! ```
//!
//! Per layer, from the file: the sliding-window layers have head width `attention.key_length_swa`, RoPE over
//! `rope.dimension_count_swa` dims with base `rope.freq_base_swa` (llama.cpp's default 10000) and the window
//! `attention.sliding_window`; the full-attention layers have `attention.key_length`, RoPE base
//! `rope.freq_base` and the "proportional" RoPE of `rope_freqs.weight` (factor 1e30 on the pairs that must
//! not turn). The attention scale is 1 (`f_attention_scale = 1.0`: the Q/K norms set the scale).
//!
//! Refused with [`Error::Unsupported`] (not built here): per-layer embeddings
//! (`embedding_length_per_layer_input` > 0, the E2B/E4B models), KV sharing across layers
//! (`attention.shared_kv_layers` > 0), the mixture-of-experts FFN (`ffn_gate_inp`), per-layer head counts or
//! FFN widths (arrays). Wiring only: the blocks are [`super::blocks`].

use crate::gguf::{GgufFile, MetaValue};
use crate::models::blocks::{
    AttnOptions, AttnTensors, Decoder, GluAct, NormKind, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::ops::AttnShape;
use crate::{Error, Result};

/// RoPE base of the sliding-window layers when the file has no `rope.freq_base_swa`
/// (`llama_hparams::rope_freq_base_train_swa = 10000.0f`).
pub const ROPE_BASE_SWA_DEFAULT: f32 = 10000.0;

/// Gemma 4's hyperparameters beyond [`DecoderDims`] (whose `head_dim` and `rope_dim` are the full-attention
/// layers'), as llama.cpp reads them (`llama_model_gemma4::load_arch_hparams`, src/llama-model.cpp).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Hparams {
    /// The common dimensions.
    pub dims: DecoderDims,
    /// `attention.sliding_window_pattern`: whether block `l` is a sliding-window layer.
    pub swa: Vec<bool>,
    /// `attention.sliding_window` (positions).
    pub window: usize,
    /// `attention.key_length_swa` (= `value_length_swa`).
    pub head_dim_swa: usize,
    /// `rope.dimension_count_swa` (default: the full layers' `rope.dimension_count`).
    pub rope_dim_swa: usize,
    /// `rope.freq_base_swa`.
    pub rope_base_swa: f32,
    /// `final_logit_softcapping`, if any.
    pub final_softcap: Option<f32>,
    /// Whether the file has `rope_freqs.weight` (used by the full-attention layers).
    pub rope_freqs: bool,
}

impl Gemma4Hparams {
    /// Read `gemma4.*` metadata.
    ///
    /// Errors: a missing key (naming it), key and value widths that differ, a width or pattern that does
    /// not fit the blocks; the unsupported variants listed in the module docs.
    pub fn read(g: &GgufFile) -> Result<Gemma4Hparams> {
        let m = Meta::new(g, "gemma4");
        let dims = DecoderDims::read_dims(&m, "attention.layer_norm_rms_epsilon")?;
        let unsupported = |what: String| {
            Error::Unsupported(format!(
                "{}: gemma4 {what} is not implemented",
                g.path().display()
            ))
        };
        if m.opt_usize("embedding_length_per_layer_input")?
            .unwrap_or(0)
            > 0
        {
            return Err(unsupported("with per-layer embeddings".into()));
        }
        if m.opt_usize("attention.shared_kv_layers")?.unwrap_or(0) > 0 {
            return Err(unsupported("with KV shared across layers".into()));
        }
        if g.tensor("blk.0.ffn_gate_inp.weight").is_ok() {
            return Err(unsupported("with a mixture-of-experts FFN".into()));
        }
        let key = |k: &str| format!("gemma4.{k}");
        let swa = match g.get(&key("attention.sliding_window_pattern")) {
            Some(MetaValue::Array(v)) => v
                .iter()
                .map(|x| match x {
                    MetaValue::Bool(b) => Ok(*b),
                    other => Err(m.error(format!(
                        "attention.sliding_window_pattern holds {other:?}, not booleans"
                    ))),
                })
                .collect::<Result<Vec<bool>>>()?,
            Some(other) => {
                return Err(m.error(format!(
                    "attention.sliding_window_pattern is {other:?}, not an array of booleans"
                )))
            }
            None => {
                return Err(m.error(
                    "metadata key 'gemma4.attention.sliding_window_pattern' not found".into(),
                ))
            }
        };
        if swa.len() != dims.n_layer {
            return Err(m.error(format!(
                "attention.sliding_window_pattern has {} entries for {} blocks",
                swa.len(),
                dims.n_layer
            )));
        }
        let head_dim_swa = m.usize("attention.key_length_swa")?;
        for (k, v) in [("", dims.head_dim), ("_swa", head_dim_swa)] {
            let vl = m
                .opt_usize(&format!("attention.value_length{k}"))?
                .unwrap_or(v);
            if vl != v {
                return Err(m.error(format!(
                    "attention.value_length{k} {vl} differs from attention.key_length{k} {v}"
                )));
            }
        }
        let rope_dim_swa = m
            .opt_usize("rope.dimension_count_swa")?
            .unwrap_or(dims.rope_dim);
        if rope_dim_swa > head_dim_swa || !rope_dim_swa.is_multiple_of(2) {
            return Err(m.error(format!(
                "rope.dimension_count_swa {rope_dim_swa} must be even and ≤ key_length_swa {head_dim_swa}"
            )));
        }
        Ok(Gemma4Hparams {
            window: m.usize("attention.sliding_window")?,
            head_dim_swa,
            rope_dim_swa,
            rope_base_swa: m
                .opt_f32("rope.freq_base_swa")?
                .unwrap_or(ROPE_BASE_SWA_DEFAULT),
            final_softcap: m.opt_f32("final_logit_softcapping")?.filter(|&c| c > 0.0),
            rope_freqs: g.tensor("rope_freqs.weight").is_ok(),
            swa,
            dims,
        })
    }

    /// The attention options of block `l`: NeoX RoPE (the layer kind's base, dims and factors), per-head
    /// Q/K norms, V's weightless norm, `kq_scale = 1`, the window on sliding-window layers.
    pub fn attn(&self, l: usize) -> AttnOptions {
        let c = &self.dims;
        let local = self.swa[l];
        let head_dim = if local { self.head_dim_swa } else { c.head_dim };
        AttnOptions {
            shape: AttnShape {
                kq_scale: 1.0,
                window: local.then_some(self.window),
                ..AttnShape::causal(c.n_head, c.n_kv_head, head_dim)
            },
            rope: Rope {
                kind: RopeKind::Neox,
                base: if local {
                    self.rope_base_swa
                } else {
                    c.rope_base
                },
                dim: if local { self.rope_dim_swa } else { c.rope_dim },
            },
            q_scale: None,
            tensors: AttnTensors {
                bias: false,
                qk_norm: true,
                v_norm: true,
                rope_freqs: !local && self.rope_freqs,
                v_from_k: true,
                no_k_bias: false,
            },
            norm_eps: c.norm_eps,
        }
    }
}

/// Build a Gemma 4 [`Decoder`] from the file.
///
/// Errors: as [`Gemma4Hparams::read`] and [`Decoder::load`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let h = Gemma4Hparams::read(g)?;
    let wiring = Wiring {
        embed_scale: Some((h.dims.d_model as f32).sqrt()),
        post_norms: true,
        act: GluAct::GeluTanh,
        gated_ffn: true,
        norm: NormKind::Rms,
        attn: &|l| h.attn(l),
        final_softcap: h.final_softcap,
    };
    let decoder = Decoder::load(g, &h.dims, &wiring)?;
    Ok((h.dims, decoder))
}
