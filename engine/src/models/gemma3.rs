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
    AttnOptions, AttnTensors, Decoder, GluAct, NormKind, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::ops::AttnShape;
use crate::Result;

/// Local/global period of the layers (`hparams.set_swa_pattern(6)`): layer `l` is global iff
/// `l % SWA_PATTERN == SWA_PATTERN - 1`.
pub const SWA_PATTERN: usize = 6;

/// RoPE base of the sliding-window layers (`hparams.rope_freq_base_train_swa = 10000.0f`).
pub const ROPE_BASE_LOCAL: f32 = 10000.0;

/// Gemma 3's hyperparameters beyond [`DecoderDims`], as llama.cpp derives them (src/llama-model.cpp,
/// `LLM_ARCH_GEMMA3`, and the gemma3 graph).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Hparams {
    /// The common dimensions.
    pub dims: DecoderDims,
    /// `attention.sliding_window` (positions), `None` when the file has none (every layer global).
    pub window: Option<usize>,
    /// `√d_model` in f32 (`sqrtf(n_embd)`), the embedding scale.
    pub embed_scale: f32,
    /// `f_attention_scale = 1/√head_dim` (the 27B's `1/√(d_model/n_head)` is not distinguished here).
    pub q_scale: f32,
}

impl Gemma3Hparams {
    /// Read `gemma3.*` metadata.
    ///
    /// Errors: as [`DecoderDims::read`] (which refuses the RoPE scaling of the larger Gemma 3 models).
    pub fn read(g: &GgufFile) -> Result<Gemma3Hparams> {
        let m = Meta::new(g, "gemma3");
        let dims = DecoderDims::read(&m)?;
        Ok(Gemma3Hparams {
            window: m.opt_usize("attention.sliding_window")?.filter(|&w| w > 0),
            embed_scale: (dims.d_model as f32).sqrt(),
            q_scale: 1.0 / (dims.head_dim as f32).sqrt(),
            dims,
        })
    }

    /// Whether block `l` is a sliding-window layer (`llama_hparams::is_swa`).
    pub fn is_local(&self, l: usize) -> bool {
        self.window.is_some() && l % SWA_PATTERN < SWA_PATTERN - 1
    }

    /// The attention options of block `l`: NeoX RoPE with the local or global base, Q pre-scaled and
    /// `kq_scale = 1`, the window on local layers, per-head Q/K norms.
    pub fn attn(&self, l: usize) -> AttnOptions {
        let c = &self.dims;
        let local = self.is_local(l);
        AttnOptions {
            shape: AttnShape {
                kq_scale: 1.0,
                window: if local { self.window } else { None },
                ..AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim)
            },
            rope: Rope {
                kind: RopeKind::Neox,
                base: if local { ROPE_BASE_LOCAL } else { c.rope_base },
                dim: c.rope_dim,
            },
            q_scale: Some(self.q_scale),
            tensors: AttnTensors {
                bias: false,
                qk_norm: true,
                ..AttnTensors::default()
            },
            norm_eps: c.norm_eps,
        }
    }
}

/// Build a Gemma 3 [`Decoder`] from the file.
///
/// Errors: as [`Gemma3Hparams::read`] and [`Decoder::load`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let h = Gemma3Hparams::read(g)?;
    let wiring = Wiring {
        embed_scale: Some(h.embed_scale),
        post_norms: true,
        act: GluAct::GeluTanh,
        gated_ffn: true,
        norm: NormKind::Rms,
        attn: &|l| h.attn(l),
        final_softcap: None,
    };
    let decoder = Decoder::load(g, &h.dims, &wiring)?;
    Ok((h.dims, decoder))
}
