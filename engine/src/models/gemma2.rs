//! `general.architecture = "gemma2"` (Gemma 2) as llama.cpp builds it (src/models/gemma2.cpp,
//! `llama_model_gemma2`; HF `Gemma2ForCausalLM`, transformers/models/gemma2/modeling_gemma2.py):
//!
//! ```text
//! x = token_embd[tokens] · √d_model                                   (inp_scaled)
//! for each block l:
//!     h = RMSNorm(x)·w_attn_norm
//!     q, k = RoPE_neox(h·Wq, h·Wk);  q = q · f_attention_scale
//!     s = c_attn · tanh(q·kᵀ / c_attn)                                 (attention logit soft-capping)
//!     x = x + RMSNorm(Wo · softmax(s + mask_l) · v)·w_attn_post_norm     (sa_out)
//!     x = x + RMSNorm(W_down · (gelu_tanh(h·W_gate) ⊙ h·W_up))·w_ffn_post_norm,  h = RMSNorm(x)·w_ffn_norm
//! logits = c_final · tanh(RMSNorm(x)·w_output_norm · token_embdᵀ / c_final)   (final logit soft-capping)
//! ```
//!
//! What llama.cpp supplies beyond the file: layers alternate sliding-window and global attention, the even
//! ones local (`load_swa_pattern(ml, 2)`, unless `attention.sliding_window_pattern` says otherwise;
//! `LLAMA_SWA_TYPE_STANDARD`); the window defaults to 4096; local layers use `rope.freq_base_swa` when the
//! file has it, else the global base; `c_attn` = `attn_logit_softcapping` (default 50), `c_final` =
//! `final_logit_softcapping` (default 30); `f_attention_scale = 1/√head_dim` (27B: 1/√(d_model/n_head), not
//! distinguished here). The head is always the tied `token_embd`. Norm weights are used as stored (the
//! converter added HF's `1 +`).
//!
//! Wiring only: the blocks are [`super::blocks`].

use crate::gguf::GgufFile;
use crate::models::blocks::{
    AttnOptions, AttnTensors, Decoder, GluAct, NormKind, Rope, RopeKind, Wiring,
};
use crate::models::hparams::{DecoderDims, Meta};
use crate::ops::AttnShape;
use crate::Result;

/// Default local/global period (`load_swa_pattern(ml, 2)`): layer `l` is local iff `l % 2 == 0`.
pub const SWA_PATTERN: usize = 2;

/// Default sliding window (`hparams.n_swa = 4096`).
pub const DEFAULT_WINDOW: usize = 4096;

/// Default attention logit soft-cap (`llama_hparams::f_attn_logit_softcapping`).
pub const DEFAULT_ATTN_SOFTCAP: f32 = 50.0;

/// Default final logit soft-cap (`llama_hparams::f_final_logit_softcapping`).
pub const DEFAULT_FINAL_SOFTCAP: f32 = 30.0;

/// Gemma 2's hyperparameters beyond [`DecoderDims`] (src/models/gemma2.cpp `load_arch_hparams`).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma2Hparams {
    /// The common dimensions.
    pub dims: DecoderDims,
    /// `attention.sliding_window` (positions).
    pub window: usize,
    /// `attention.sliding_window_pattern`: layer `l` is local iff `l % pattern < pattern − 1`.
    pub pattern: usize,
    /// RoPE base of the local layers (`rope.freq_base_swa`, else the global base).
    pub rope_base_local: f32,
    /// `attn_logit_softcapping`.
    pub attn_softcap: f32,
    /// `final_logit_softcapping`.
    pub final_softcap: f32,
}

impl Gemma2Hparams {
    /// Read `gemma2.*` metadata.
    ///
    /// Errors: as [`DecoderDims::read`]; a zero or non-finite soft-cap, a zero window or pattern.
    pub fn read(g: &GgufFile) -> Result<Gemma2Hparams> {
        let m = Meta::new(g, "gemma2");
        let dims = DecoderDims::read(&m)?;
        let h = Gemma2Hparams {
            window: m
                .opt_usize("attention.sliding_window")?
                .unwrap_or(DEFAULT_WINDOW),
            pattern: m
                .opt_usize("attention.sliding_window_pattern")?
                .unwrap_or(SWA_PATTERN),
            rope_base_local: m.opt_f32("rope.freq_base_swa")?.unwrap_or(dims.rope_base),
            attn_softcap: m
                .opt_f32("attn_logit_softcapping")?
                .unwrap_or(DEFAULT_ATTN_SOFTCAP),
            final_softcap: m
                .opt_f32("final_logit_softcapping")?
                .unwrap_or(DEFAULT_FINAL_SOFTCAP),
            dims,
        };
        let caps_ok = [h.attn_softcap, h.final_softcap]
            .iter()
            .all(|c| c.is_finite() && *c > 0.0);
        if !caps_ok || h.window == 0 || h.pattern == 0 {
            return Err(m.error(format!(
                "gemma2: soft-caps {} and {}, window {} and pattern {} must be positive",
                h.attn_softcap, h.final_softcap, h.window, h.pattern
            )));
        }
        Ok(h)
    }

    /// Whether block `l` is a sliding-window layer (`llama_hparams::is_swa`, `set_swa_pattern`).
    pub fn is_local(&self, l: usize) -> bool {
        l % self.pattern < self.pattern - 1
    }

    /// The attention options of block `l`: NeoX RoPE with the layer's base, Q pre-scaled by 1/√head_dim
    /// and `kq_scale = 1`, the soft-cap, the window on local layers.
    pub fn attn(&self, l: usize) -> AttnOptions {
        let c = &self.dims;
        let local = self.is_local(l);
        AttnOptions {
            shape: AttnShape {
                kq_scale: 1.0,
                window: local.then_some(self.window),
                softcap: Some(
                    if crate::faults::is(crate::faults::Fault::AttnSoftcapFromFinal) {
                        self.final_softcap
                    } else {
                        self.attn_softcap
                    },
                ),
                ..AttnShape::causal(c.n_head, c.n_kv_head, c.head_dim)
            },
            rope: Rope {
                kind: RopeKind::Neox,
                base: if local {
                    self.rope_base_local
                } else {
                    c.rope_base
                },
                dim: c.rope_dim,
            },
            q_scale: Some(1.0 / (c.head_dim as f32).sqrt()),
            tensors: AttnTensors::default(),
            norm_eps: c.norm_eps,
        }
    }
}

/// Build a Gemma 2 [`Decoder`] from the file.
///
/// Errors: as [`Gemma2Hparams::read`] and [`Decoder::load`].
pub fn load(g: &GgufFile) -> Result<(DecoderDims, Decoder)> {
    let h = Gemma2Hparams::read(g)?;
    let wiring = Wiring {
        embed_scale: Some((h.dims.d_model as f32).sqrt()),
        post_norms: true,
        act: GluAct::GeluTanh,
        gated_ffn: true,
        norm: NormKind::Rms,
        attn: &|l| h.attn(l),
        final_softcap: Some(h.final_softcap),
    };
    let decoder = Decoder::load(g, &h.dims, &wiring)?;
    Ok((h.dims, decoder))
}
